"""Answer extraction: boxed, Answer: lines, last number, and the method chain."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.rewards.extract import (
    EXTRACTORS,
    answer_line,
    extract_answer,
    last_boxed,
    last_number,
)

# ----------------------------------------------------------------------------- last_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{5}$.", "5"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
        (r"first \boxed{1}, then \boxed{2}", "2"),
        (r"\fbox{7}", "7"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{ 3 }", "3"),
        (r"the answer is $\boxed 5$", "5"),
        (r"the answer is \boxed 42.", "42"),
        (r"\boxed{1} and \boxed{\frac{1}{2}", None),  # the last one is truncated
        (r"\boxed{", None),
        (r"\boxed{}", None),
        (r"\boxed", None),
        (r"\boxedx{3}", None),  # a different macro
        ("no box here", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


# ----------------------------------------------------------------------------- answer_line


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Work...\nAnswer: 42", "42"),
        ("Answer: 42.\n", "42"),
        ("answer: $x^2$", "x^2"),
        ("**Answer:** 7", "7"),
        ("**Answer**: 7", "7"),
        ("**Answer: 7**", "7"),
        ("Final Answer: 3/4", "3/4"),
        ("Answer: 1\nchecking...\nAnswer: 2\nDone.", "2"),
        (r"Answer: $\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        ("Answer:\n\n  12\n", "12"),
        (r"Answer: \(5\)", "5"),
        # Minerva's answer line, with or without its parts.
        ("Final Answer: The final answer is $[2,5)$. I hope it is correct.", "[2,5)"),
        ("The final answer is $24$. I hope it is correct.", "24"),
        ("Final Answer: The final answer is 3.5. I hope it is correct.", "3.5"),
        ("The final answer is $x^2$.", "x^2"),
        ("the final answer is: 7", "7"),
        ("The final answer is 16. I hope it is correct. Note: more text", "16"),
        # A line opening with inline math: what is inside, whatever follows it.
        ("Answer: $5$, as shown.", "5"),
        ("Answer: $$x^2$$", "x^2"),
        (r"Answer: $\$36$ in all", r"\$36"),
        ("Answer: **$5$**.", "5"),
        ("Answer: .5", ".5"),
        ("Answer:", None),
        ("Answer: $$", None),
        ("The final answer is", None),
        ("no marker at all 42", None),
    ],
)
def test_answer_line(text: str, expected: str | None) -> None:
    assert answer_line(text) == expected


# ----------------------------------------------------------------------------- last_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She has 3 apples and buys 4 more, so 7.", "7"),
        ("The total is 1,234 dollars", "1234"),
        ("1,000,000 people", "1000000"),
        ("costs $12.50.", "12.50"),
        ("temperature drops to -5", "-5"),
        ("x = -3.25", "-3.25"),
        ("pages 3-5", "5"),  # a range, not minus five
        ("about .5 of it", ".5"),
        ("nothing numeric", None),
    ],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


# ----------------------------------------------------------------------------- extract_answer


def test_methods_tried_in_order() -> None:
    text = "I think \\boxed{3}.\nAnswer: 4\nso 5"
    assert extract_answer(text, ["boxed", "answer_line", "last_number"]) == "3"
    assert extract_answer(text, ["answer_line", "boxed"]) == "4"
    assert extract_answer(text, ["last_number"]) == "5"


def test_falls_through_to_next_method() -> None:
    assert extract_answer("so the result is 18", ["boxed", "answer_line", "last_number"]) == "18"
    # An empty box is no answer, so the next method gets its turn.
    assert extract_answer("\\boxed{} Answer: 9", ["boxed", "answer_line"]) == "9"
    assert extract_answer("nothing", ["boxed", "answer_line", "last_number"]) is None
    assert extract_answer("\\boxed{1}", []) is None


def test_unknown_method_names_known_ones() -> None:
    with pytest.raises(ValueError, match="boxed"):
        extract_answer("\\boxed{1}", ["boxed", "regex"])


_LATEXISH = st.text(
    alphabet=st.sampled_from(list("\\{}$ .,-:*\n0123456789abfxoA")) | st.characters(),
    max_size=200,
)
_FRAGMENTS = st.lists(
    st.sampled_from([r"\boxed", r"\fbox", "{", "}", "\\", "Answer:", "**", "$", "1,234", "-"])
    | _LATEXISH,
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(_LATEXISH, _FRAGMENTS))
def test_extract_never_raises(text: str) -> None:
    for name in EXTRACTORS:
        result = EXTRACTORS[name](text)
        assert result is None or (isinstance(result, str) and result.strip() == result != "")
    extract_answer(text, list(EXTRACTORS))
