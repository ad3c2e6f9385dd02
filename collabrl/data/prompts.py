"""Prompt templates, one per paper, with the answer extractors that fit them.

Templates produce chat messages; the engine applies the model's own chat
template, so the same template works for any policy model.
"""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.engines.base import ChatMessage
from collabrl.errors import UserError


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    system: str | None
    user: str  # formatted with {problem}
    extract: tuple[str, ...]  # answer extractors, tried in order
    source: str

    def messages(self, problem: str) -> list[ChatMessage]:
        user = self.user.replace("{problem}", problem)  # not str.format: problems contain braces
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": user}]

    def extractors(self, fallback: tuple[str, ...]) -> tuple[str, ...]:
        """The template's answer extractors, then a benchmark's fallbacks not among them."""
        return self.extract + tuple(e for e in fallback if e not in self.extract)


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
    ),
    "plain": PromptTemplate(
        name="plain",
        system=None,
        user="{problem}",
        extract=("boxed", "answer_line", "last_number"),
        source="no instruction; the problem alone",
    ),
}


def get_prompt(name: str) -> PromptTemplate:
    if name not in PROMPTS:
        raise UserError(f"unknown prompt template '{name}'", f"use one of {', '.join(PROMPTS)}")
    return PROMPTS[name]
