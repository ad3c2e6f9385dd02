"""The python tool end to end: correction, the real sandbox, the text the policy reads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from collabrl.tools.correction import GUIDANCE
from collabrl.tools.python import (
    NO_OUTPUT,
    SPEC,
    PythonTool,
    PythonToolConfig,
    build_python_tool,
    trim_traceback,
)
from collabrl.tools.retrieval import RetrievalConfig, RetrievalTool
from collabrl.tools.sandbox import Sandbox, SandboxLimits
from tests.tools.test_correction import PAPER_COMB, PAPER_FENCED, PAPER_FENCED_OUTPUT

# Small limits keep a runaway test short; numpy/sympy imports fit well inside them.
LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_mb=2048)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS)


@pytest.fixture(scope="module")
def tool(sandbox: Sandbox) -> PythonTool:
    return PythonTool(sandbox)


def test_fenced_code_is_fixed_and_run(tool):
    result = tool.call({"code": PAPER_FENCED})
    assert result.ok, result
    assert result.text == PAPER_FENCED_OUTPUT.strip()
    assert result.meta["fixes"] == ["strip_fences"]
    assert result.meta["isolation"] == tool.sandbox.isolation
    assert result.meta["limit"] is None and result.meta["duration_s"] > 0


def test_name_error_returns_traceback_tail_and_guidance(tool):
    # math and Fraction are imported by the rules; c6_3 is the model's own mistake.
    result = tool.call({"code": PAPER_COMB})
    assert result.error == "NameError"
    assert result.meta["fixes"] == ["add_missing_imports"]
    lines = result.text.splitlines()
    assert "Traceback (most recent call last):" in lines
    assert "NameError: name 'c6_3' is not defined" in lines
    assert "numerator_B = c0_4 + c1_4 * c6_3" in result.text  # the failing line is quoted
    assert lines[-1] == GUIDANCE["NameError"]
    assert result.meta["feedback"] == GUIDANCE["NameError"]


def test_output_before_a_failure_is_kept(tool):
    result = tool.call({"code": "print('partial')\nvalues = [1]\nprint(values[5])"})
    assert result.error == "IndexError"
    assert result.text.startswith("partial\nTraceback")
    assert result.text.endswith(GUIDANCE["IndexError"])


def test_library_frames_are_left_out_of_the_traceback(tool):
    result = tool.call({"code": "import numpy as np\nprint(np.linalg.inv(np.zeros((2, 2))))"})
    assert result.error == "LinAlgError"
    assert result.text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<code>", line 2, in <module>',
        "    print(np.linalg.inv(np.zeros((2, 2))))",
        "           " + "^" * 31,
        "  (2 frames inside libraries left out)",
        "numpy.linalg.LinAlgError: Singular matrix",
    ]


def test_trim_traceback_keeps_frames_of_the_code_between_library_frames():
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "<code>", line 5, in <module>\n'
        "    main()\n"
        '  File "/lib/sympy/core/cache.py", line 72, in wrapper\n'
        "    retval = cfunc(*args, **kwargs)\n"
        "             ^^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "<code>", line 3, in main\n'
        "    return helper(-1)\n"
        '  File "/lib/sympy/functions/combinatorial/factorials.py", line 9, in eval\n'
        "    raise ValueError(message)\n"
        "ValueError: argument must be nonnegative\n"
    )
    assert trim_traceback(stderr).splitlines() == [
        "Traceback (most recent call last):",
        '  File "<code>", line 5, in <module>',
        "    main()",
        "  (1 frame inside libraries left out)",
        '  File "<code>", line 3, in main',
        "    return helper(-1)",
        "  (1 frame inside libraries left out)",
        "ValueError: argument must be nonnegative",
    ]
    # Only the last lines are kept: the error and the frames nearest to it.
    assert trim_traceback(stderr, max_lines=2).splitlines() == [
        "  (1 frame inside libraries left out)",
        "ValueError: argument must be nonnegative",
    ]
    syntax = "  File \"<code>\", line 1\n    x = (1,\n        ^\nSyntaxError: '(' was never closed"
    assert trim_traceback(syntax) == syntax


def test_error_without_guidance_has_no_feedback(tool):
    result = tool.call({"code": "print(1 / 0)"})
    assert result.error == "ZeroDivisionError"
    assert result.text.splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert "feedback" not in result.meta


def test_bare_last_expression_is_printed(tool):
    result = tool.call({"code": "answer = sum(range(101))\nanswer"})
    assert (result.ok, result.text) == (True, "5050")
    assert result.meta["fixes"] == ["print_last_expression"]


def test_a_failing_last_expression_is_quoted_as_the_model_wrote_it(tool):
    result = tool.call({"code": "values = [1, 2]\nvalues[2] * 10"})
    assert result.error == "IndexError"
    assert "    values[2] * 10" in result.text.splitlines()
    assert "__value" not in result.text


def test_empty_output_says_so(tool):
    result = tool.call({"code": "x = 41 + 1\n"})
    assert (result.ok, result.text, result.meta["fixes"]) == (True, NO_OUTPUT, [])


@pytest.mark.parametrize(
    "arguments",
    [{}, {"code": ""}, {"code": "  \n\t"}, {"code": 42}, {"code": None}, {"query": "print(1)"}],
)
def test_bad_arguments_are_refused_without_running(arguments):
    # A sandbox that could not run anything: the call must not get that far.
    result = PythonTool(sandbox=None).call(arguments)  # type: ignore[arg-type]
    assert result.error == "bad_arguments"
    assert result.text.startswith("python: ") and '"code"' in result.text


@pytest.mark.parametrize(
    ("code", "limit"),
    [("while True:\n    pass", "cpu_time"), ("import time\ntime.sleep(60)", "wall_time")],
)
def test_runaway_code_names_the_limit(code, limit):
    tool = PythonTool(Sandbox(SandboxLimits(cpu_seconds=1, wall_seconds=2)))
    result = tool.call({"code": code})
    assert (result.error, result.meta["limit"]) == (limit, limit)
    assert result.text == f"Error: the run hit its {limit.replace('_', ' ')} limit."
    assert "feedback" not in result.meta  # a limit is not one of the paper's error types
    assert result.meta["duration_s"] < 5


def test_concurrent_calls_get_their_own_outputs(tool):
    codes = [f"n = {k}\nprint(n * n)" for k in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda code: tool.call({"code": code}), codes))
    assert [r.text for r in results] == [str(k * k) for k in range(6)]
    assert all(r.ok for r in results)


def test_without_correction_the_code_runs_as_written(sandbox):
    tool = PythonTool(sandbox, correction=False)
    fenced = tool.call({"code": "```python\nprint(1)\n```"})
    assert fenced.error == "SyntaxError"
    assert fenced.meta["fixes"] == [] and "feedback" not in fenced.meta
    bare = tool.call({"code": "6 * 7"})
    assert (bare.ok, bare.text) == (True, NO_OUTPUT)


def test_build_without_model_has_no_corrector():
    config = PythonToolConfig(sandbox=LIMITS)
    config.check()
    tool = build_python_tool(config)
    assert tool.spec is SPEC and tool.correction and tool.corrector is None
    assert SPEC.parameters["required"] == ["code"]
    tool.close()


@pytest.mark.slow
def test_embedded_model_explains_a_name_error():
    tool = build_python_tool(
        PythonToolConfig(correction_model="smollm2-135m", feedback_max_tokens=32, sandbox=LIMITS)
    )
    try:
        result = tool.call({"code": "print(total_count + 1)"})
    finally:
        tool.close()
    assert result.error == "NameError"
    note = result.meta["feedback"]
    assert note.startswith(GUIDANCE["NameError"] + "\n")
    assert note[len(GUIDANCE["NameError"]) + 1 :].strip()  # the model wrote something
    assert result.text.endswith(note)


@pytest.fixture
def retrieval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RetrievalTool:
    """The real retrieve tool over the math module's docs: raw chunks, no model."""
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    return RetrievalTool(RetrievalConfig(raw=True))


def test_library_errors_append_what_retrieval_finds(sandbox, retrieval):
    tool = PythonTool(sandbox, retrieval=retrieval)
    result = tool.call({"code": "import math\nprint(math.comb(-1, 2))"})
    assert result.error == "ValueError"
    request = {
        "repo_name": "math",
        "query": "How to use math.comb? "
        "It failed with ValueError: n must be a non-negative integer",
    }
    found = retrieval.call(request)
    documentation = f"Documentation of math that may help:\n{found.text}"
    assert result.meta["retrieval"] == documentation
    # The order the policy reads: traceback, the fixed note, then the documentation.
    assert result.text.endswith(GUIDANCE["ValueError"] + "\n" + documentation)


def test_retrieval_is_not_consulted_for_other_errors(sandbox, retrieval):
    tool = PythonTool(sandbox, retrieval=retrieval)
    for code in ["import math\nprint(math.comb(n, 2))", "import math\nprint(math.pi / 0)"]:
        result = tool.call({"code": code})
        assert result.error in ("NameError", "ZeroDivisionError")
        assert "retrieval" not in result.meta and "Documentation" not in result.text


def test_build_passes_retrieval_unless_the_config_turns_it_off(retrieval):
    assert build_python_tool(PythonToolConfig(sandbox=LIMITS), retrieval).retrieval is retrieval
    off = PythonToolConfig(sandbox=LIMITS, retrieval_feedback=False)
    assert build_python_tool(off, retrieval).retrieval is None
