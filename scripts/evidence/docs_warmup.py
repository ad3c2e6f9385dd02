"""The retrieve warm-up of AlphaApollo's documentation task, its calls written by rule.

    python scripts/evidence/docs_warmup.py DATA OUT [--set apollo.KEY=VALUE ...]

Sampled retrieve traces did not work with SmolLM2-135M (issue 36): shown a worked
retrieve call (`apollo.few_shot`) it copies it word for word, another function's repo
and query (0 traces kept of 8); shown none, it never closes the forced call (7 of 8)
or writes one that cannot be read (1). So here the call is written by a rule, the one
`docs_qa.py` checked every question with: `repo_name` the repo the question names,
`query` the question itself. Everything else is `collab build-warmup apollo` unchanged:
the real tools run the call, a trace is kept only when the documentation returned
shows the gold answer, and its rows (the call, then "The answer is \\boxed{X}." with X
read from the response) are asked with the aid-free A.1 prompt in the policy's chat
template. The rule plays the policy's engine; the policy's tokenizer encodes its text.

DATA is docs_qa.py's train.jsonl; OUT the warm-up folder (resumed when it exists);
`--set` takes `collab build-warmup apollo`'s keys (`apollo.tools=[retrieve,python]`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from collabrl.builders.apollo_warmup import ApolloWarmupConfig, build_apollo_warmup
from collabrl.config import build_config
from collabrl.engines.base import Completion, Prompt, SamplingParams, cut_at_stop
from collabrl.errors import UserError
from collabrl.models import load_tokenizer
from collabrl.protocols.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE

# docs_qa.py's question, its repo captured; the last one in a prompt is the user's.
QUESTION = re.compile(
    r"What is the default value of the `[^`\n]+` parameter of [^\s?]+\? "
    r"Look it up in the (\w+) documentation and answer with the value as the signature "
    r"writes it\."
)
# After the response the builder writes the answer row itself, from what the tool showed.
AFTER_RESPONSE = "The answer is in the documentation above."


def rule_call(question: str, repo: str) -> str:
    """The call docs_qa.py checked the question with, as the protocol reads a call."""
    arguments = {"repo_name": repo, "query": question}
    call = json.dumps({"name": "retrieve", "arguments": arguments})
    return f"{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}"


class RuleCaller:
    """An engine that writes the rule's call for the question of each prompt, and after
    a tool response a closing sentence; it decodes prompts with the policy's tokenizer."""

    name = "rule-caller"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        return [[self._complete(prompt, params)] * params.n for prompt in prompts]

    def _complete(self, prompt: Prompt, params: SamplingParams) -> Completion:
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)
        questions = list(QUESTION.finditer(text))
        if not questions:
            raise UserError("a prompt holds no docs_qa.py question", "pass docs_qa.py's data")
        last = questions[-1]
        answered = TOOL_RESPONSE_CLOSE in text[last.end() :]
        written = AFTER_RESPONSE if answered else rule_call(last.group(0), last.group(1))
        kept, stop = cut_at_stop(written, params.stop, params.include_stop)
        return Completion(kept, finish_reason="stop", stop_reason=stop)

    def close(self) -> None:
        pass


def warmup_config(data: str, out: str, sets: list[str]) -> ApolloWarmupConfig:
    """The build's config: `sets` over DATA, OUT and no sampling aids (the rule writes the
    whole call, so a forced opening would double it)."""
    aids = {"aid_tool": "retrieve", "few_shot": False, "force_call": False}
    return build_config(ApolloWarmupConfig, [{"data": data, "out": out, "apollo": aids}], sets)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="docs_qa.py's train.jsonl")
    parser.add_argument("out", help="the warm-up folder")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    config = warmup_config(args.data, args.out, args.sets)
    result = build_apollo_warmup(config, engine=RuleCaller(load_tokenizer(config.model)))
    stats = result.stats
    print(f"{result.out_dir}: {stats['traces']} traces of {stats['units']}, {stats['rows']} rows")
    print(f"rejected: {stats['rejected']}")


if __name__ == "__main__":
    main(sys.argv[1:])
