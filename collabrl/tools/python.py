"""The `python` tool (AlphaApollo §2.2): model-written code, corrected, run in the sandbox.

A call takes `{"code": …}`. The rule-based correction runs first (`correction.py`),
then the code runs in a fresh sandbox (`sandbox.py`: its own process, kernel limits,
no network, no secrets). What the policy reads is the output, or the traceback and,
for the error types the paper names, the cause and a suggested fix — and, for errors
of library calls, what the `retrieve` tool finds about the function, when given one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from collabrl.config import EngineConfig, option
from collabrl.errors import UserError
from collabrl.tools.base import Tool, ToolResult, ToolSpec, bad_arguments, call_safely, not_text
from collabrl.tools.correction import ModelCorrector, correct, feedback, retrieval_request
from collabrl.tools.sandbox import CODE_FILE, Execution, Sandbox, SandboxLimits

# Appendix A.2. The paper's text extraction lost the tool's name and its opening
# line; the first sentence is ours, the rest is verbatim.
SPEC = ToolSpec(
    name="python",
    description=(
        "Run Python code and return what it prints.\n"
        "Args:\n"
        "code: code text\n"
        "Returns:\n"
        "The result of the code execution\n"
        "metadata:\n"
        '"limitations": 1) "Do not perform plotting operations, such as using matplotlib.", '
        '2) "If you want to use external packages, you can only use sympy, scipy, numpy, '
        'math, cmath, fractions, and itertools.", 3) "Not applicable to geometry and number '
        'theory problems.", 4) "No access to any system resources, file operations, or '
        'network requests.", 5) "All calculations must be self-contained within a single '
        'function or script.", 6) "Input must be provided directly in the query string.", '
        '7) "Output is limited to numerical results or simple lists/tuples of numbers.".\n'
        '"best_practices": 1) "Provide clear and specific queries that describe the desired '
        'mathematical calculation.", 2) "Include all necessary numerical inputs directly in '
        'the query string.", 3) "Ensure all required numerical data is included in the '
        'query.".'
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "code text"}},
        "required": ["code"],
    },
)

NO_OUTPUT = "(no output; print the values you need)"
TRACEBACK_LINES = 12  # the end of a traceback: where the error and its line are
_FRAME = re.compile(r'^  File "(.*)", line \d+')


@dataclass
class PythonToolConfig:
    """The python tool: correction, model feedback on errors, and the sandbox."""

    correction: bool = option(True, "Rule-based correction before each run (appendix B.1).")
    max_code_bytes: int = option(
        64 * 1024,
        "Longest code a call may send, in UTF-8 bytes; longer is refused before correction, "
        "which runs outside the sandbox's limits (a 4 MB source costs it ~20 s and 1.5 GB).",
    )
    correction_model: str | None = option(
        None,
        "Model (reference or base URL) that explains a NameError, IndexError, ValueError, "
        "TypeError, AttributeError or ImportError; without one, a fixed note on the cause.",
    )
    feedback_max_tokens: int = option(128, "Tokens the correction model may write.")
    engine: EngineConfig = option(EngineConfig(), "Engine of the correction model.")
    retrieval_feedback: bool = option(
        True,
        "After a ValueError, TypeError, AttributeError or ImportError in a library call, "
        "append what the retrieve tool finds about the function (when it is offered too).",
    )
    sandbox: SandboxLimits = option(SandboxLimits(), "Limits of every run (docs/tools.md).")

    def check(self) -> None:
        self.sandbox.check()
        if self.feedback_max_tokens < 1:
            raise UserError(
                f"feedback_max_tokens must be >= 1, got {self.feedback_max_tokens}",
                "give the correction model room for a sentence or more",
            )
        if self.max_code_bytes < 1:
            raise UserError(
                f"max_code_bytes must be >= 1, got {self.max_code_bytes}",
                "the default, 65536, fits any program a policy writes in one call",
            )


class PythonTool:
    """Runs model-written code; safe to call from several threads at once.

    `retrieval` is the `retrieve` tool consulted after a library call fails; it is
    borrowed, not owned: whoever built it closes it.
    """

    spec = SPEC

    def __init__(
        self,
        sandbox: Sandbox,
        correction: bool = True,
        corrector: ModelCorrector | None = None,
        retrieval: Tool | None = None,
        max_code_bytes: int = PythonToolConfig.max_code_bytes,
    ) -> None:
        self.sandbox = sandbox
        self.correction = correction
        self.max_code_bytes = max_code_bytes
        self.corrector = corrector
        self.retrieval = retrieval

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return bad_arguments(self.spec, '"code" must be a non-empty string of Python code')
        size = len(code.encode(errors="surrogatepass"))
        if size > self.max_code_bytes:
            return ToolResult(
                f"python: the code is {size} bytes, over the limit of {self.max_code_bytes}; "
                "send shorter code",
                error="too_long",
            )
        # Checked here, not left to the sandbox: Python source is UTF-8 text.
        problem = not_text({"code": code})
        if problem:
            hint = "to mean Python's escape in a string, write it with two backslashes in JSON"
            return bad_arguments(self.spec, f"{problem}; {hint}")
        fixed = correct(code) if self.correction else None
        code = fixed.code if fixed else code
        run = self.sandbox.run(code)
        meta: dict[str, Any] = {
            "fixes": fixed.fixes if fixed else [],
            "limit": run.limit,
            "isolation": run.isolation,
            "run_bound": run.run_bound,
            "duration_s": round(run.duration_s, 3),
        }
        if run.ok:
            return ToolResult(run.stdout.strip() or NO_OUTPUT, None, meta)
        failure = text = _failure_text(run)
        note = feedback(run.error_type, code, failure, self.corrector)
        if note:
            meta["feedback"] = note
            text += "\n" + note
        documentation = self._look_up(run.error_type, code, failure)
        if documentation:
            meta["retrieval"] = documentation
            text += "\n" + documentation
        return ToolResult(text, run.error_type, meta)

    def _look_up(self, error_type: str | None, code: str, traceback: str) -> str | None:
        """What the retrieve tool says about the library call that failed, if anything."""
        if self.retrieval is None:
            return None
        request = retrieval_request(error_type, code, traceback)
        if request is None:
            return None
        found = call_safely(self.retrieval, request)
        if not found.ok:
            return None
        return f"Documentation of {request['repo_name']} that may help:\n{found.text}"

    def close(self) -> None:
        if self.corrector is not None:
            self.corrector.close()


def _failure_text(run: Execution) -> str:
    """What printed before the failure, then the end of the traceback or the limit hit."""
    tail = trim_traceback(run.stderr)
    if run.limit and not tail:
        tail = f"Error: the run hit its {run.limit.replace('_', ' ')} limit."
    return "\n".join(part for part in (run.stdout.strip(), tail) if part)


def trim_traceback(stderr: str, max_lines: int = TRACEBACK_LINES) -> str:
    """The traceback the model can act on: the frames of its own code and the error.

    Frames inside libraries (numpy's, sympy's internals) say nothing the model can
    change; each run of them becomes one line, and only the last lines are kept.
    """
    kept: list[str] = []
    hidden, in_library = 0, False
    for line in stderr.strip("\n").splitlines():  # keep the indent of a first frame
        frame = _FRAME.match(line)
        if frame:
            in_library = not _is_code(frame.group(1))
        elif not line.startswith("    "):  # a frame's quoted source is indented 4+
            in_library = False
        if in_library:
            hidden += frame is not None
            continue
        if hidden:
            kept.append(f"  ({hidden} frame{'s' * (hidden > 1)} inside libraries left out)")
            hidden = 0
        kept.append(line)
    return "\n".join(kept[-max_lines:])


def _is_code(filename: str) -> bool:
    """Whether a frame is the code's own: "<code>", or the jail's copy of it that the
    children of multiprocessing's spawn method run (sandbox.CODE_FILE)."""
    return filename == CODE_FILE or filename.endswith("/" + CODE_FILE)


def build_python_tool(config: PythonToolConfig, retrieval: Tool | None = None) -> PythonTool:
    """The tool with its correction model loaded, if any; `retrieval` (the retrieve tool,
    when offered as well) is consulted after library errors unless the config says no."""
    from collabrl.engines import create_engine, is_url

    corrector = None
    if config.correction_model:
        engine = create_engine(config.correction_model, config.engine)
        serial = not is_url(config.correction_model)
        corrector = ModelCorrector(engine, config.feedback_max_tokens, serial)
    consulted = retrieval if config.retrieval_feedback else None
    return PythonTool(
        Sandbox(config.sandbox), config.correction, corrector, consulted, config.max_code_bytes
    )
