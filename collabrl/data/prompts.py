"""Prompt templates, one per paper, with the answer extractors that fit them.

Templates produce chat messages; the engine applies the model's own chat
template, so the same template works for any policy model. A template may carry
worked examples (few-shot, `with_shots`), shown before every problem either as
alternating user and assistant turns or inside the one user turn.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from collabrl.data.benchmarks import Item
from collabrl.engines.base import ChatMessage
from collabrl.errors import UserError
from collabrl.rewards.extract import extract_answer

# GSM8K's calculator annotations (`48/2 = <<48/2=24>>24`) and its closing `#### 72` line:
# the dataset's bookkeeping, not text a model is asked to write.
_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")
_GSM8K_ANSWER_RE = re.compile(r"\n?#### .*\Z")
# Between the examples of a single-turn few-shot prompt, and after the last.
SHOT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Shot:
    """A worked example shown before the problem: its row's id, the problem and the reply."""

    id: str
    problem: str
    reply: str


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    system: str | None
    user: str  # formatted with {problem}
    extract: tuple[str, ...]  # answer extractors, tried in order
    source: str
    # How an example's reply states its answer (`{answer}` replaced): the format the
    # template asks for, so that the examples show it.
    final: str = "The final answer is $\\boxed{{answer}}$."
    shots: tuple[Shot, ...] = ()
    # Each example as a user turn and an assistant turn (lm-eval's `--fewshot_as_multiturn`);
    # False: every example and the problem in one user turn.
    multiturn: bool = True

    def messages(self, problem: str) -> list[ChatMessage]:
        head: list[ChatMessage] = (
            [{"role": "system", "content": self.system}] if self.system else []
        )
        if self.multiturn:
            for shot in self.shots:
                head += [
                    {"role": "user", "content": self._user(shot.problem)},
                    {"role": "assistant", "content": shot.reply},
                ]
            return [*head, {"role": "user", "content": self._user(problem)}]
        examples = [f"{self._user(shot.problem)}\n{shot.reply}" for shot in self.shots]
        content = SHOT_SEPARATOR.join([*examples, self._user(problem)])
        return [*head, {"role": "user", "content": content}]

    def _user(self, problem: str) -> str:
        return self.user.replace("{problem}", problem)  # not str.format: problems contain braces

    def extractors(self, fallback: tuple[str, ...]) -> tuple[str, ...]:
        """The template's answer extractors, then a benchmark's fallbacks not among them."""
        return self.extract + tuple(e for e in fallback if e not in self.extract)

    def with_shots(self, examples: list[Item], multiturn: bool) -> PromptTemplate:
        """This template showing `examples` (rows with their answers, and their worked
        solutions where they have them) before every problem, each reply ending in the
        answer format the template asks for."""
        shots = tuple(Shot(i.id, i.problem, self.reply(i.solution, i.answer)) for i in examples)
        return replace(self, shots=shots, multiturn=multiturn)

    def reply(self, solution: str | None, answer: str) -> str:
        """An example's reply: its solution (GSM8K's annotations dropped), then its answer
        as the template asks for it, unless the solution already states it so (MATH's
        `\\boxed{}` under a boxed template)."""
        text = _GSM8K_ANSWER_RE.sub("", _CALCULATOR_RE.sub("", solution or "")).strip()
        if text and extract_answer(text, self.extract[:1]) is not None:
            return text
        stated = self.final.replace("{answer}", answer)
        return f"{text}\n{stated}" if text else stated

    def record(self) -> dict[str, Any]:
        """The template as results.json records it: every field, the examples included."""
        return asdict(self)


PROMPTS: dict[str, PromptTemplate] = {
    "relay": PromptTemplate(
        name="relay",
        system="Please reason step by step, and put your final answer within \\boxed{}.",
        user="{problem}",
        extract=("boxed", "answer_line"),
        source="RelayLLM appendix C.1 (solver prompt)",
    ),
    "eapo-eval": PromptTemplate(
        name="eapo-eval",
        system=(
            "You are a helpful assistant.\n"
            'You must give the final answer in the last line, in the format of "Answer: xxx", '
            "xxx represents the final answer."
        ),
        user="{problem}",
        extract=("answer_line", "boxed"),
        source="EAPO appendix D (prompt during evaluation)",
        final="Answer: {answer}",
    ),
    "plain": PromptTemplate(
        name="plain",
        system=None,
        user="{problem}",
        extract=("boxed", "answer_line", "bold", "last_number"),
        source="no instruction; the problem alone",
    ),
}


def get_prompt(name: str) -> PromptTemplate:
    if name not in PROMPTS:
        raise UserError(f"unknown prompt template '{name}'", f"use one of {', '.join(PROMPTS)}")
    return PROMPTS[name]
