"""What a request asks the model, checked before it is queued: its prompts' ids, within
what the served model can take (`ModelLimits`), and its sampling params.

Prompts are encoded here, not on the generation thread, so that what the model cannot
take is refused at once with a 400 in OpenAI's error shape: text the tokenizer cannot
render, a prompt longer than the model's context (a 1 MB prompt once held the server for
eleven minutes), `max_tokens` beyond what the context leaves, token ids outside the
vocabulary, `tools` a chat template would not show the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from collabrl.engines.base import Prompt, SamplingParams, continues_assistant, encode_prompt
from collabrl.serve.openai_api import UNHONOURED, ChatFields, SamplingFields, bad_request
from collabrl.serve.stops import StopLimits


@dataclass(frozen=True)
class ModelLimits:
    """What the served model can take, to refuse a prompt before it is queued."""

    tokenizer: Any
    context: int | None  # tokens, prompt and completion together; None: unknown
    # The longest text one token stands for: a prompt of more than context × this many
    # characters has more tokens than the context, and is refused without tokenizing it.
    chars_per_token: int

    @classmethod
    def of(cls, tokenizer: Any, context: int | None) -> ModelLimits:
        longest = max((len(piece) for piece in tokenizer.get_vocab()), default=1)
        return cls(tokenizer, context, longest)

    def encode(self, prompt: Prompt, options: dict[str, Any] | None, param: str) -> list[int]:
        """The prompt's ids, or a 400 naming `param` when the model cannot take it."""
        if self.context is not None:
            chars = _chars(prompt)
            if chars > self.context * self.chars_per_token:
                raise bad_request(
                    f"This model's maximum context length is {self.context} tokens; the "
                    f"prompt has {chars} characters, more than that many tokens can hold",
                    param,
                )
        try:
            ids = encode_prompt(self.tokenizer, prompt, options)
        except (TemplateError, TypeError, ValueError) as err:
            raise bad_request(f"cannot render the prompt: {err}", param) from err
        self.check_ids(ids, param)
        if self.context is not None and len(ids) >= self.context:
            raise bad_request(
                f"This model's maximum context length is {self.context} tokens; the prompt "
                f"has {len(ids)} tokens and at least one must be left to generate",
                param,
            )
        return ids

    def check_ids(self, ids: list[int], param: str) -> None:
        """A 400 naming `param` when an id is not in the vocabulary."""
        vocab = len(self.tokenizer)
        if any(not 0 <= i < vocab for i in ids):
            raise bad_request(f"token ids must be in 0..{vocab - 1} (the vocabulary)", param)

    def max_tokens(self, asked: int | None, default: int, prompt_tokens: int) -> int:
        """The completion's budget: what was asked, if the context has room for it."""
        if self.context is None:
            return asked or default
        room = self.context - prompt_tokens
        if asked is None:
            return min(default, room)
        if asked > room:
            raise bad_request(
                f"max_tokens is too large: {asked}. This model's maximum context length is "
                f"{self.context} tokens and the prompt has {prompt_tokens} ({asked} > "
                f"{self.context} - {prompt_tokens})",
                "max_tokens",
            )
        return asked


def _chars(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m.get("content", "")) for m in prompt if isinstance(m, dict))


def messages_of(req: ChatFields) -> list[dict[str, str]]:
    return [{"role": m.role, "content": _text_of(m.content)} for m in req.messages]


def chat_prompt(req: ChatFields, messages: list[dict[str, str]], limits: ModelLimits) -> list[int]:
    """The chat prompt's ids, with `tools` rendered by the chat template. A template that
    ignores them (SmolLM2's) would leave the model unaware of them: a 400, not a prompt
    without tools."""
    options = dict(req.chat_template_kwargs or {})
    if not req.add_generation_prompt:  # vLLM's field: render without the assistant header
        options["add_generation_prompt"] = False
    if not req.tools:
        if req.tool_choice not in UNHONOURED["tool_choice"]:
            raise bad_request("tool_choice needs tools", "tool_choice")
        return limits.encode(messages, options or None, "messages")
    if req.tool_choice == "none":  # OpenAI: the model is to call no tool; it is not shown any
        return limits.encode(messages, options or None, "messages")
    if req.tool_choice not in (None, "auto"):
        raise bad_request(
            "tool_choice: only auto or none (this server does not force a tool call)",
            "tool_choice",
        )
    prompt = limits.encode(messages, {**options, "tools": req.tools}, "tools")
    if prompt == limits.encode(messages, options or None, "messages"):
        raise bad_request(
            "tools: this model's chat template does not render tools, so the model would "
            "never see them; describe them in a message instead",
            "tools",
        )
    return prompt


def check_continuation(req: ChatFields, messages: list[dict[str, str]]) -> None:
    """The engines continue a final assistant message; say so rather than guess."""
    if req.continue_final_message != continues_assistant(messages):
        raise bad_request(
            "continue_final_message=true needs a final assistant message, and a final "
            "assistant message needs continue_final_message=true",
            "continue_final_message",
        )


def prompts_of(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt is empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # one prompt given as token ids
    if any(isinstance(p, list) and not p for p in prompt):
        raise bad_request("prompt: a list of token ids is empty", "prompt")
    return list(prompt)  # a batch of texts, or of token-id lists (lm-eval's default)


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def asked_tokens(req: SamplingFields) -> int | None:
    return req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens


def sampling_params(
    req: SamplingFields, max_tokens: int, logprobs: bool, stop_limits: StopLimits
) -> SamplingParams:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    try:
        stop_limits.check(stop)
    except ValueError as err:
        raise bad_request(str(err), "stop") from err
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            n=req.n,
            seed=req.seed,
            stop=stop,
            include_stop=req.include_stop_str_in_output,
            banned=tuple(req.bad_words or ()),
            logprobs=logprobs,
        )
    except ValueError as err:
        raise bad_request(str(err)) from err
