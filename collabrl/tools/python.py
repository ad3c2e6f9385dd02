"""The `python` tool (AlphaApollo §2.2): model-written code, corrected, run in the sandbox.

A call takes `{"code": …}`. The rule-based correction runs first (`correction.py`),
then the code runs in a fresh sandbox (`sandbox.py`: its own process, kernel limits,
no network, no secrets). What the policy reads is the output, or the traceback and,
for the error types the paper names, the cause and a suggested fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collabrl.config import EngineConfig, option
from collabrl.errors import UserError
from collabrl.tools.base import ToolResult, ToolSpec, bad_arguments
from collabrl.tools.correction import ModelCorrector, correct, feedback
from collabrl.tools.sandbox import Execution, Sandbox, SandboxLimits

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


@dataclass
class PythonToolConfig:
    """The python tool: correction, model feedback on errors, and the sandbox."""

    correction: bool = option(True, "Rule-based correction before each run (appendix B.1).")
    correction_model: str | None = option(
        None,
        "Model (reference or base URL) that explains a NameError, IndexError, ValueError, "
        "TypeError, AttributeError or ImportError; without one, a fixed note on the cause.",
    )
    feedback_max_tokens: int = option(128, "Tokens the correction model may write.")
    engine: EngineConfig = option(EngineConfig(), "Engine of the correction model.")
    sandbox: SandboxLimits = option(SandboxLimits(), "Limits of every run (docs/tools.md).")

    def check(self) -> None:
        self.sandbox.check()
        if self.feedback_max_tokens < 1:
            raise UserError(f"feedback_max_tokens must be >= 1, got {self.feedback_max_tokens}")


class PythonTool:
    """Runs model-written code; safe to call from several threads at once."""

    spec = SPEC

    def __init__(
        self, sandbox: Sandbox, correction: bool = True, corrector: ModelCorrector | None = None
    ) -> None:
        self.sandbox = sandbox
        self.correction = correction
        self.corrector = corrector

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return bad_arguments(self.spec, '"code" must be a non-empty string of Python code')
        fixed = correct(code) if self.correction else None
        run = self.sandbox.run(fixed.code if fixed else code)
        meta = {
            "fixes": fixed.fixes if fixed else [],
            "limit": run.limit,
            "isolation": run.isolation,
            "duration_s": round(run.duration_s, 3),
        }
        if run.ok:
            return ToolResult(run.stdout.strip() or NO_OUTPUT, None, meta)
        text = _failure_text(run)
        note = feedback(run.error_type, fixed.code if fixed else code, text, self.corrector)
        if note:
            meta["feedback"] = note
            text += "\n" + note
        return ToolResult(text, run.error_type, meta)

    def close(self) -> None:
        if self.corrector is not None:
            self.corrector.close()


def _failure_text(run: Execution) -> str:
    """What printed before the failure, then the end of the traceback or the limit hit."""
    tail = "\n".join(run.stderr.strip().splitlines()[-TRACEBACK_LINES:])
    if run.limit and not tail:
        tail = f"Error: the run hit its {run.limit.replace('_', ' ')} limit."
    return "\n".join(part for part in (run.stdout.strip(), tail) if part)


def build_python_tool(config: PythonToolConfig) -> PythonTool:
    from collabrl.engines import create_engine

    corrector = None
    if config.correction_model:
        engine = create_engine(config.correction_model, config.engine)
        corrector = ModelCorrector(engine, config.feedback_max_tokens)
    return PythonTool(Sandbox(config.sandbox), config.correction, corrector)
