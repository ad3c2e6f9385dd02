"""EAPO's reward (paper §2.1): token F1, a small bonus for a well-formed miss, and an
optional consultation penalty.

    R = f1(ŷ, g)  if the F1 score is not 0,
        0.1       if the F1 score is 0 with correct format,
        0         otherwise.

The F1 is `collabrl.rewards.f1.token_f1` of the extracted answer; the format check is
`format_ok` on what the policy wrote.
"""

from __future__ import annotations

from collabrl.rewards.extract import answer_line

# "0.1 if f1 score is 0 with correct format": keeps a well-formed wrong answer above an
# unparsable one, so the format is learnt even on problems the policy never solves.
FORMAT_REWARD = 0.1


def format_ok(text: str) -> bool:
    """Whether `text` ends in the answer line EAPO asks for.

    The paper's prompts require "the final answer in the last line, in the format of
    "Answer: xxx"" (evaluation prompt), and the training prompt's example ends in one.
    So: the last non-blank line holds an `Answer:` marker with a non-empty answer, as
    `extract.answer_line` reads it (`**Answer:**`, `Final Answer:`, a `\\boxed{}` are
    accepted). Pass only what the policy wrote (`protocols.consult.policy_text`): the
    experts' returns end in "Answer:" lines too.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    return bool(lines) and answer_line(lines[-1]) is not None


def eapo_reward(f1: float, format_ok: bool, penalty: float = 0.0, calls: int = 0) -> float:
    """The EAPO reward of one episode: `f1` of its answer, `format_ok` of its text.

    `penalty` × `calls` is subtracted in every branch. The paper says only that "a
    penalty term on consultation is introduced" (§1) so that the model consults less
    as training goes on, without its form or weight; a fixed cost per consultation is
    our reading, and the default `penalty=0` is the reward of §2.1 as printed. `calls`
    counts the episode's consultations (`len(episode.calls)`: one per expert query).
    """
    if not 0.0 <= f1 <= 1.0:
        raise ValueError(f"F1 must be in [0, 1], got {f1}")
    if penalty < 0 or calls < 0:
        raise ValueError(f"penalty and calls must be >= 0, got {penalty} and {calls}")
    if f1 > 0:
        base = f1
    elif format_ok:
        base = FORMAT_REWARD
    else:
        base = 0.0
    return base - penalty * calls
