"""Relay decoding overhead: a relay episode vs the two models' own decode time.

A relay episode interleaves a student (policy) and a teacher. Its cost beyond the
tokens themselves is the switching: every resume re-reads the context (prefill),
every teacher call renders and reads the stripped context in the teacher's chat
template, plus stop-string checks and bookkeeping. This script measures

    overhead = wall time of the relay episodes
               / (student's own decode time for the student's tokens
                  + teacher's own decode time for the teacher's tokens)

where "own decode time" is each model generating that many tokens in one go from
the problem prompt, at the same batch size. The student is SmolLM2-135M made to
call every `--every` tokens for `--n` teacher tokens (a wrapper appends the
command after each `--every` real tokens: the call positions are fixed, the text
is the model's own). Both sides run in this process, interleaved `--repeats`
times; medians are reported.

    python bench/relay_overhead.py                     # B=1 and B=4, 192-token episodes
    python bench/relay_overhead.py --batch-sizes 1 --repeats 1 --max-tokens 64   # smoke
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import PreTrainedModel  # noqa: E402

from collabrl.config import EngineConfig, PoolConfig  # noqa: E402
from collabrl.data.benchmarks import load_benchmark  # noqa: E402
from collabrl.data.prompts import get_prompt  # noqa: E402
from collabrl.engines.base import Completion, SamplingParams  # noqa: E402
from collabrl.engines.hf import TransformersEngine  # noqa: E402
from collabrl.engines.pool import ExpertPool  # noqa: E402
from collabrl.episode import Author, Episode  # noqa: E402
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.relay import RelayConfig, RelayProtocol  # noqa: E402

TARGET = 1.2


class CallingStudent:
    """The real model, which writes `<call>n</call>` after every `every` tokens."""

    def __init__(self, engine: TransformersEngine, every: int, n: int) -> None:
        self.engine, self.every = engine, every
        self.name = f"calling:{engine.name}"
        self.tokenizer = engine.tokenizer
        self.command = self.tokenizer(f"<call>{n}</call>", add_special_tokens=False)["input_ids"]
        self.decoded = 0  # tokens the model really generated

    def generate(self, prompts, params: SamplingParams) -> list[list[Completion]]:
        step = SamplingParams(max_tokens=min(self.every, params.max_tokens), seed=params.seed)
        out = self.engine.generate(prompts, step)
        results = []
        for [c] in out:
            self.decoded += len(c.token_ids)
            if (
                c.finish_reason == "length"
                and len(c.token_ids) + len(self.command) <= params.max_tokens
            ):
                ids = c.token_ids + self.command
                c = Completion(self.tokenizer.decode(ids), ids, None, "stop", "</call>")
            results.append([c])
        return results

    def close(self) -> None:
        pass


class ForwardProfile:
    """Counts and times the forward passes of some models: decode steps (one new token
    per row) by batch size, and prefills (several new tokens) by the positions they read."""

    def __init__(self, name: str, models: list[PreTrainedModel]) -> None:
        self.name = name
        self.steps: Counter[int] = Counter()
        self.step_seconds = self.prefill_seconds = 0.0
        self.prefills = self.prefill_positions = 0
        self._began = 0.0
        self._hooks = [h for m in models for h in self._hook(m)]

    def _hook(self, model: PreTrainedModel):
        yield model.register_forward_pre_hook(self._before)
        yield model.register_forward_hook(self._after, with_kwargs=True)

    def _before(self, module, args) -> None:
        self._began = time.perf_counter()

    def _after(self, module, args, kwargs, output) -> None:
        seconds = time.perf_counter() - self._began
        rows, width = kwargs.get("input_ids", args[0] if args else None).shape
        if width == 1:
            self.steps[rows] += 1
            self.step_seconds += seconds
        else:
            self.prefills += 1
            self.prefill_positions += rows * width
            self.prefill_seconds += seconds

    def close(self) -> str:
        """Remove the hooks; the counts as one line."""
        for hook in self._hooks:
            hook.remove()
        by_rows = ", ".join(f"{n} at {rows}" for rows, n in sorted(self.steps.items()))
        return (
            f"  {self.name}: {sum(self.steps.values())} decode steps ({by_rows} rows) "
            f"{self.step_seconds:.2f} s · {self.prefills} prefills of "
            f"{self.prefill_positions} positions {self.prefill_seconds:.2f} s"
        )


def relay_run(
    student: TransformersEngine, teacher_ref: str, tasks, args, known: list[PreTrainedModel]
) -> tuple[float, list[Episode], int, list[str]]:
    student.reset()  # nothing from an earlier repeat (the same episodes) is served
    calling = CallingStudent(student, args.every, args.n)
    template = get_prompt("relay")
    # The policy writes on after a teacher EOS: the bench times a fixed call pattern.
    config = RelayConfig(max_calls=1000, continue_after_teacher_eos=True)
    pool = PoolConfig(endpoints=[teacher_ref], num_experts=1, timeout=config.teacher_timeout)
    teacher = ExpertPool(pool, EngineConfig(prefix_cache=not args.no_prefix_cache))
    teacher.ask_sync([(1, "warm up")], SamplingParams(max_tokens=1))  # load outside the timing
    profiles = []
    if args.profile:  # the pool loaded the teacher: the one model this script did not
        gc.collect()
        loaded = [m for m in gc.get_objects() if isinstance(m, PreTrainedModel)]
        # A causal LM holds its base model, itself a PreTrainedModel: keep the outer ones.
        inner = {id(sub) for m in loaded for sub in m.modules() if sub is not m}
        teacher_models = [
            m for m in loaded if id(m) not in inner and all(m is not k for k in known)
        ]
        profiles = [
            ForwardProfile("student", [student.model]),
            ForwardProfile("teacher", teacher_models),
        ]
    relay = RelayProtocol(
        Policy(calling, student.tokenizer, owns_engine=False),
        teacher,
        template,
        config,
        template.extract,
    )
    began = time.perf_counter()
    episodes = relay.run(tasks, SamplingParams(max_tokens=args.max_tokens, seed=0))
    seconds = time.perf_counter() - began
    relay.close()
    return seconds, episodes, calling.decoded, [p.close() for p in profiles]


def own_decode(engine: TransformersEngine, prompts, tokens: int) -> float:
    """Seconds per generated row-token when `engine` writes `tokens` per prompt in one go."""
    began = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_tokens=max(tokens, 1)))
    seconds = time.perf_counter() - began
    produced = max(len(c.token_ids) for [c] in out)
    return seconds / max(produced, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--every", type=int, default=40, help="student tokens between calls")
    parser.add_argument("--n", type=int, default=24, help="teacher tokens per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-prefix-cache", action="store_true", help="re-read the whole context every turn"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="count each relay run's decode steps by batch size and its prefills",
    )
    args = parser.parse_args()

    # The relay student and teacher reuse their KV caches across turns (as `collab`
    # engines do by default); the baselines decode from the prompt on their own copies.
    student = TransformersEngine.from_ref(args.model, prefix_cache=not args.no_prefix_cache)
    student_alone = TransformersEngine.from_ref(args.model)
    teacher_engine = TransformersEngine.from_ref(args.model)
    template = get_prompt("relay")
    problems = load_benchmark("gsm8k").items
    print(
        f"model {args.model} (student and teacher) · budget {args.max_tokens} tokens · "
        f"call every {args.every} student tokens for {args.n} teacher tokens"
    )
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        tasks = [Task(p.id, p.problem) for p in problems[:batch]]
        prompts = [student.encode(template.messages(t.question)) for t in tasks]
        ratios = []
        for repeat in range(args.repeats):
            known = [student.model, student_alone.model, teacher_engine.model]
            wall, episodes, decoded, profiles = relay_run(student, args.model, tasks, args, known)
            student_rows = decoded / batch  # real student tokens per episode (mean)
            teacher_rows = sum(e.tokens_by(Author.TEACHER) for e in episodes) / batch
            calls = sum(len(e.calls) for e in episodes)
            per_tok_s = own_decode(student_alone, prompts, round(student_rows))
            per_tok_t = own_decode(teacher_engine, prompts, round(teacher_rows))
            own = student_rows * per_tok_s + teacher_rows * per_tok_t
            ratios.append(wall / own)
            print(
                f"B={batch} repeat {repeat}: relay {wall:.2f} s · own decode {own:.2f} s "
                f"(student {student_rows:.0f} tok × {per_tok_s * 1000:.1f} ms, teacher "
                f"{teacher_rows:.0f} tok × {per_tok_t * 1000:.1f} ms) · {calls} calls · "
                f"ratio {wall / own:.3f}"
            )
            for line in profiles:
                print(line)
        median = statistics.median(ratios)
        verdict = "met" if median <= TARGET else "missed"
        print(f"B={batch}: median overhead {median:.3f}× (target ≤ {TARGET}×: {verdict})")


if __name__ == "__main__":
    main()
