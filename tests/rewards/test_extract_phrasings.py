"""The answer phrasings models write, read off whole realistic completions: each is
credited by the rule that states it (not only by the last-number fallback), and a
phrasing mid-text never takes the place of the final answer."""

from __future__ import annotations

import pytest

from collabrl.rewards.extract import answer_line, extract_answer_by, last_bold

# The relay template's extractors, then GSM8K's fallbacks (benchmarks.yaml).
GSM8K = ("boxed", "answer_line", "bold", "last_number")

QWEN_COT = """Natalia sold 48 clips in April.
In May she sold half as many: 48 / 2 = 24 clips.
Altogether: 48 + 24 = 72 clips.

The answer is: 72"""

LLAMA_COT = """## Step 1: Clips sold in May
Natalia sold half as many clips in May as in April, so 48 / 2 = 24.

## Step 2: Add the two months
48 + 24 = 72.

The final answer is: $\\boxed{72}$"""

MINERVA = """The diameter of the image is $s = \\alpha f$, which is $1.6$ cm for these values.
Final Answer: The final answer is $1.6$. I hope it is correct."""

GSM8K_STYLE = """Natalia sold 48/2 = <<48/2=24>>24 clips in May.
Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.
#### 72"""

EAPO = """First compute the clips sold in May: 24.
Then add April's 48.
Answer: 72"""

MARKDOWN = """**Step 1:** May's clips are half of April's: 48 / 2 = 24.
**Step 2:** Together: 48 + 24 = **72** clips.

So Natalia sold **72** clips. (Check: 72 - 48 = 24.)"""

PHRASE_WITH_UNIT = "She sells 9 eggs a day at $2 each, so the answer is 18 dollars. Check: 9 * 2"


@pytest.mark.parametrize(
    ("text", "answer", "rule"),
    [
        (QWEN_COT, "72", "answer_line"),
        (LLAMA_COT, "72", "boxed"),
        (MINERVA, "1.6", "answer_line"),
        (GSM8K_STYLE, "72", "answer_line"),
        (EAPO, "72", "answer_line"),
        (MARKDOWN, "72", "bold"),  # the last number, 24, is the check's
        (PHRASE_WITH_UNIT, "18", "answer_line"),
        ("The answer is 72.", "72", "answer_line"),
        ("So the answer is **72** clips.", "72", "answer_line"),
        ("Therefore the answer is $\\frac{1}{2}$.", "\\frac{1}{2}", "answer_line"),
        ("Thus the answer is (1, 2), as the graph shows.", "(1, 2)", "answer_line"),
        ("answer: 1,234", "1,234", "answer_line"),
        ("The total cost is **$18**.", "18", "bold"),
    ],
)
def test_each_phrasing_is_read_by_its_rule(text: str, answer: str, rule: str) -> None:
    assert extract_answer_by(text, GSM8K) == (answer, rule)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        # A phrase mid-text that is prose, not an answer: the stated answer stays.
        ("Answer: 12\n\nNote that the answer is always even for such sums.", "12"),
        ("Answer: 8. Note the answer is 2 more than 6.", "8"),
        ("The answer is not obvious at first.\nAfter working it out: Answer: 5", "5"),
        # A first answer that the model revises: the last one counts.
        ("The answer is 5. Wait: 3 + 4 = 7, not 5. So the final answer is 7.", "7"),
        ("I first thought the answer is 12, but 48 + 24 = 72.\n#### 72", "72"),
        # "answer" without its marker is no marker.
        ("To find the answer, add 48 and 24 to get 72.", None),
        ("My answer would depend on x.", None),
    ],
)
def test_a_phrase_mid_text_does_not_steal_the_final_answer(text: str, answer: str | None) -> None:
    assert answer_line(text) == answer


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("**Step 2:** add them.\n**1.** First", None),  # headings and list markers
        ("**Answer:** see below", None),  # a label: answer_line's, not bold's
        ("Half is **$\\frac12$**, so done.", "\\frac12"),
        ("**3** apples and **4** pears make **7** fruit, **Check:** ok", "7"),
    ],
)
def test_bold_reads_the_last_bold_answer(text: str, answer: str | None) -> None:
    assert last_bold(text) == answer


def test_the_fallback_still_reads_text_without_any_marker() -> None:
    assert extract_answer_by("48 + 24 = 72", GSM8K) == ("72", "last_number")
