"""Evaluation sampling throughput: the `TransformersEngine` vs a per-sample loop.

Both sides run in this one process, on the same model object, the same prompts
(the first P problems of a benchmark, formatted with its prompt template through
the tokenizer's chat template), greedy decoding and the same max-tokens / EOS
settings. Measurements are interleaved -- loop, batched B1, batched B2, loop, ...
-- for `--repeats` rounds, and the median of each configuration is reported, so
machine noise falls on both sides alike.

The engine runs in two modes, each at every batch size: `static` batches (rows
sorted by length, cut into batches, each run through `generate` until its longest row
ends: finished rows keep being fed pad tokens, which costs time but adds no tokens) and
`continuous` batching (a finished row's place goes to the next waiting prompt). Only
tokens actually produced count: a row's tokens up to and including its EOS. The
engine's prefix store is emptied before every run, so a repeat never reuses the
previous repeat's prompts.

    python bench/eval_throughput.py                       # P=16, batch 8 and 16
    python bench/eval_throughput.py -P 64 --batch-sizes 16 --max-tokens 512
    python bench/eval_throughput.py --step-profile        # + forward-pass ceiling

Timings on a shared CPU are noisy. The script measures how much CPU other
processes used during each measurement (from /proc/stat), waits for them to
go quiet before each one (`--wait-idle`), redoes disturbed measurements
(`--redo-disturbed`) and says in the output which timings were still disturbed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

TARGET_RATIO = 5.0  # the goal: >= 5x the per-sample loop at batch >= 8
TARGET_MIN_BATCH = 8
COUNT_TOLERANCE = 0.10  # warn when token counts differ by more than this


# -- measurement records ---------------------------------------------------------


@dataclass
class Run:
    """One timed pass over all prompts by one configuration."""

    config: str
    repeat: int
    seconds: float
    tokens: int
    per_prompt_tokens: list[int]
    per_prompt_ids: list[list[int]]
    other_cpu: float | None  # mean cores used by other processes during the run
    own_cpu: float  # mean cores used by this process during the run
    redone: int = 0  # earlier attempts discarded because other processes were busy
    generate_seconds: float = 0.0  # time inside model.generate
    row_steps: int = 0  # rows x decode steps that generate computed
    prompt_slots: int = 0  # prompt positions fed to prefill, padding included
    prompt_tokens: int = 0  # real prompt tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Summary:
    config: str
    tokens: int
    seconds: float
    tokens_per_s: float
    ratio: float
    paired_ratios: list[float] = field(default_factory=list)
    other_cpu: float | None = None
    runs_used: int = 0  # runs the medians are taken over
    runs_total: int = 0


# -- CPU accounting --------------------------------------------------------------


def _system_busy_seconds() -> float | None:
    """CPU-seconds all processes spent busy since boot (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal ...: drop idle and iowait.
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """How busy this process and everything else kept the CPU over an interval."""

    def __enter__(self) -> CpuMeter:
        self._sys0 = _system_busy_seconds()
        self._own0 = _own_cpu_seconds()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        own = _own_cpu_seconds() - self._own0
        sys1 = _system_busy_seconds()
        self.own_cores = own / self.seconds
        if self._sys0 is None or sys1 is None:
            self.other_cores = None
        else:
            # /proc/stat ticks are coarse (10 ms); clamp the small negative jitter.
            self.other_cores = max(0.0, (sys1 - self._sys0 - own) / self.seconds)


def wait_for_idle(cores: int, max_wait: float, window: float = 2.0) -> float:
    """Wait until other processes leave the CPU alone for `window` seconds.

    Returns the seconds waited (gives up after `max_wait`). Torch's threads
    spin at barriers, so one busy neighbour on a 2-core machine can slow a
    2-thread forward pass several-fold, far more than its fair share.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        with CpuMeter() as meter:
            time.sleep(window)
        if meter.other_cores is None or meter.other_cores < 0.1 * cores:
            break
    return time.perf_counter() - start


# -- a model proxy that times generate -------------------------------------------


class TimedModel:
    """Forwards everything to the model; records time and shapes of `generate`.

    Handed to `TransformersEngine` in place of the model, so the benchmark can
    split the engine's time into model work and its own pre/post-processing,
    and count the row-steps a batch computes -- without touching library code.
    """

    def __init__(self, model: Any) -> None:
        self._model = model
        self.reset()

    def reset(self) -> None:
        self.generate_seconds = 0.0
        self.row_steps = 0
        self.prompt_slots = 0
        self.prompt_tokens = 0

    def get_base_model(self) -> Any:
        """The wrapped model, as a peft model answers: the engine reads the KV-cache
        keyword from its `forward` (transformers 5.24 renamed it), which a proxy lacks."""
        return self._model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A forward pass of the continuous path: one new token per row is a decode step,
        anything longer a prefill (which never has padding there)."""
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        t0 = time.perf_counter()
        out = self._model(*args, **kwargs)
        self.generate_seconds += time.perf_counter() - t0
        rows, width = input_ids.shape
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if width == 1 and cache is not None and cache.get_seq_length() > 1:
            self.row_steps += rows
        else:  # a prefill: it yields each row's first token, as generate's first step does
            self.row_steps += rows
            self.prompt_slots += rows * width
            self.prompt_tokens += rows * width
        return out

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        t0 = time.perf_counter()
        out = self._model.generate(*args, **kwargs)
        self.generate_seconds += time.perf_counter() - t0
        sequences = out.sequences if hasattr(out, "sequences") else out
        rows, width = input_ids.shape
        self.row_steps += rows * (sequences.shape[1] - width)
        self.prompt_slots += rows * width
        self.prompt_tokens += int(mask.sum()) if mask is not None else rows * width
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


# -- the two sides ---------------------------------------------------------------


def count_until_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """Tokens up to and including the first EOS (what the engine keeps too)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


def run_loop(
    model: TimedModel, tokenizer: Any, messages: list, args, eos_ids: list[int], rep: int
) -> Run:
    """Per-sample baseline: chat template, one `model.generate` per prompt, decode."""
    import torch

    eos = set(eos_ids)
    kept: list[list[int]] = []
    model.reset()
    with CpuMeter() as meter:
        for prompt in messages:
            ids = tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            input_ids = torch.tensor([ids], device=model.device)
            with torch.inference_mode():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=args.max_tokens,
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    eos_token_id=eos_ids,
                    pad_token_id=tokenizer.pad_token_id,
                )
            tokens = count_until_eos(out[0, input_ids.shape[1] :].tolist(), eos)
            tokenizer.decode(tokens, skip_special_tokens=True)  # same text work as the engine
            kept.append(tokens)
    return _record("per-sample loop", rep, meter, kept, model)


def run_batched(
    label: str, engine: Any, model: TimedModel, messages: list, params: Any, rep: int
) -> Run:
    model.reset()
    engine.reset()  # no prompt of an earlier run is served from the prefix store
    with CpuMeter() as meter:
        results = engine.generate(messages, params)
    kept = [completions[0].token_ids for completions in results]
    return _record(label, rep, meter, kept, model)


def _record(
    config: str, rep: int, meter: CpuMeter, kept: list[list[int]], model: TimedModel
) -> Run:
    counts = [len(t) for t in kept]
    return Run(
        config=config,
        repeat=rep,
        seconds=meter.seconds,
        tokens=sum(counts),
        per_prompt_tokens=counts,
        per_prompt_ids=kept,
        other_cpu=meter.other_cores,
        own_cpu=meter.own_cores,
        generate_seconds=model.generate_seconds,
        row_steps=model.row_steps,
        prompt_slots=model.prompt_slots,
        prompt_tokens=model.prompt_tokens,
    )


# -- optional: forward-pass ceiling ----------------------------------------------


def step_profile(
    model: Any,
    batch_sizes: list[int],
    context: int,
    steps: int,
    rounds: int,
    before=lambda: None,
    growing: bool = False,
) -> dict[int, float]:
    """Median seconds of one KV-cached decode step at each batch size.

    `B * t(1) / t(B)` is the best tokens/s ratio batching can reach on this
    machine when every row is useful: an upper bound for the table above.
    `growing` times the continuous engine's cache (preallocated buffers) instead
    of transformers' default one (which `generate`, hence the loop, uses).
    """
    import torch
    from transformers import DynamicCache

    from collabrl.engines.continuous import (
        _right_align,
        cache_argument,
        growing_cache,
        spare_room,
    )

    sizes = sorted({1, *batch_sizes})
    times: dict[int, list[float]] = {b: [] for b in sizes}
    vocab = min(model.config.vocab_size, 10_000)
    gen = torch.Generator().manual_seed(0)
    for _ in range(rounds):  # interleaved, like the main measurement
        for b in sizes:
            before()
            ids = torch.randint(0, vocab, (b, context), generator=gen, device=model.device)
            nxt = torch.randint(0, vocab, (b, 1), generator=gen, device=model.device)
            with torch.inference_mode():
                cache = DynamicCache()
                model(input_ids=ids, **cache_argument(model, cache), use_cache=True)
                if growing:
                    room = spare_room(context + steps)
                    buffers = [
                        (
                            _right_align([layer.keys], context, room),
                            _right_align([layer.values], context, room),
                        )
                        for layer in cache.layers
                    ]
                    cache = growing_cache(buffers, context)
                for _ in range(steps):
                    t0 = time.perf_counter()
                    model(input_ids=nxt, **cache_argument(model, cache), use_cache=True)
                    times[b].append(time.perf_counter() - t0)
    return {b: statistics.median(ts) for b, ts in times.items()}


# -- reporting -------------------------------------------------------------------


def summarize(runs: list[Run], configs: list[str], cores: int) -> list[Summary]:
    """Medians per configuration, over its undisturbed runs when it has any."""
    kept = {c: _undisturbed([r for r in runs if r.config == c], cores) for c in configs}
    base_tps = statistics.median(r.tokens_per_s for r in kept[configs[0]])
    base_by_rep = {r.repeat: r.tokens_per_s for r in runs if r.config == configs[0]}
    out = []
    for c in configs:
        rs = kept[c]
        tps = statistics.median(r.tokens_per_s for r in rs)
        other = [r.other_cpu for r in rs if r.other_cpu is not None]
        out.append(
            Summary(
                config=c,
                tokens=int(statistics.median(r.tokens for r in rs)),
                seconds=statistics.median(r.seconds for r in rs),
                tokens_per_s=tps,
                ratio=tps / base_tps,
                paired_ratios=[
                    r.tokens_per_s / base_by_rep[r.repeat] for r in runs if r.config == c
                ],
                other_cpu=max(other) if other else None,
                runs_used=len(rs),
                runs_total=sum(r.config == c for r in runs),
            )
        )
    return out


def _disturbed(run: Run, cores: int) -> bool:
    return run.other_cpu is not None and run.other_cpu > 0.1 * cores


def _undisturbed(runs: list[Run], cores: int) -> list[Run]:
    clean = [r for r in runs if not _disturbed(r, cores)]
    return clean or runs


def print_table(summaries: list[Summary]) -> None:
    header = (
        f"{'configuration':<18}{'gen tokens':>11}{'seconds':>10}{'tokens/s':>10}{'vs loop':>9}"
        f"{'median of':>11}   per-repeat ratio (vs the loop of the same round)"
    )
    print(header)
    print("-" * len(header))
    for s in summaries:
        paired = ", ".join(f"{x:.2f}x" for x in s.paired_ratios)
        used = f"{s.runs_used}/{s.runs_total} runs"
        print(
            f"{s.config:<18}{s.tokens:>11d}{s.seconds:>10.1f}{s.tokens_per_s:>10.1f}"
            f"{s.ratio:>8.2f}x{used:>11}   {paired}"
        )
    if any(s.runs_used < s.runs_total for s in summaries):
        print(
            "median of k/n runs: the n-k runs disturbed by other processes are left out "
            "(their per-repeat ratios are still listed)"
        )


def print_checks(runs: list[Run], configs: list[str], cores: int) -> None:
    base = next(r for r in runs if r.config == configs[0])
    print("\nchecks")
    for c in configs[1:]:
        r = next(x for x in runs if x.config == c)
        k = len(base.per_prompt_ids)  # the loop may have run on the first k prompts only
        tokens = sum(r.per_prompt_tokens[:k])
        diff = (tokens - base.tokens) / base.tokens
        same = sum(a == b for a, b in zip(r.per_prompt_ids[:k], base.per_prompt_ids, strict=True))
        flag = (
            "  <-- differs by more than 10%: tokens/s compares unequal work"
            if abs(diff) > COUNT_TOLERANCE
            else ""
        )
        print(
            f"  {c}: {tokens} tokens vs loop {base.tokens} ({diff:+.1%}) on the loop's {k} "
            f"prompts; identical token sequences for {same}/{k}{flag}"
        )
    unstable = {c for c in configs if len({r.tokens for r in runs if r.config == c}) > 1}
    if unstable:
        print(f"  token counts changed between repeats for: {', '.join(sorted(unstable))}")
    redone = sum(r.redone for r in runs)
    if redone:
        print(
            f"  {redone} measurement(s) were redone because other processes were busy during them"
        )
    busy = [r for r in runs if _disturbed(r, cores)]
    if busy:
        worst = max(busy, key=lambda r: r.other_cpu or 0)
        print(
            f"  WARNING: other processes used > 10% of the {cores} cores during "
            f"{len(busy)}/{len(runs)} measurements (worst: {worst.other_cpu:.2f} cores during "
            f"{worst.config} #{worst.repeat}); treat those timings with care"
        )
    else:
        print(f"  other processes used < 10% of the {cores} cores during every measurement")


def print_breakdown(runs: list[Run], configs: list[str]) -> None:
    """Where the time goes, from the fastest (least disturbed) run of each configuration."""
    print("\nwhere the time goes (fastest repeat of each configuration)")
    print(
        f"  {'configuration':<18}{'in model':>12}{'outside':>9}{'row-steps':>11}"
        f"{'useful':>8}{'prompt pad':>12}{'steps/s':>9}"
    )
    for c in configs:
        r = min((r for r in runs if r.config == c), key=lambda r: r.seconds)
        useful = r.tokens / r.row_steps if r.row_steps else float("nan")
        pad = 1 - r.prompt_tokens / r.prompt_slots if r.prompt_slots else float("nan")
        outside = r.seconds - r.generate_seconds
        print(
            f"  {c:<18}{r.generate_seconds:>11.1f}s{outside:>8.2f}s{r.row_steps:>11d}"
            f"{useful:>8.0%}{pad:>12.0%}{r.row_steps / r.generate_seconds:>9.1f}"
        )
    print(
        "  row-steps: rows x decode steps computed; useful: share of them that produced a kept\n"
        "  token; prompt pad: share of prefill positions that were left padding; steps/s:\n"
        "  row-steps per second of generate"
    )


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu
            )
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}"


# -- main ------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default="smollm2-135m", help="model reference (default: smollm2-135m)"
    )
    p.add_argument(
        "--benchmark", default="gsm8k", help="benchmark name or data file (default: gsm8k)"
    )
    p.add_argument("--prompt", default="relay", help="prompt template (default: relay)")
    p.add_argument("--problems", "-P", type=int, default=16, help="first P problems (default: 16)")
    p.add_argument("--max-tokens", type=int, default=128, help="max new tokens (default: 128)")
    p.add_argument(
        "--loop-problems",
        type=int,
        metavar="K",
        help="run the per-sample loop on the first K problems only (default: all P): its "
        "tokens/s does not depend on how many prompts it loops over, and it is slow",
    )
    p.add_argument(
        "--batch-sizes", default="8,16", help="comma-separated engine batch sizes (default: 8,16)"
    )
    p.add_argument(
        "--modes",
        default="static,continuous",
        help="comma-separated engine modes, static and/or continuous (default: both)",
    )
    p.add_argument(
        "--repeats", type=int, default=2, help="interleaved rounds; medians reported (default: 2)"
    )
    p.add_argument("--dtype", default="float32", help="model dtype (default: float32)")
    p.add_argument(
        "--wait-idle",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="before each measurement wait up to this long for other processes to go quiet "
        "(default: 60; 0: off)",
    )
    p.add_argument(
        "--redo-disturbed",
        type=int,
        default=2,
        metavar="K",
        help="redo a measurement up to K times when other processes used > 10%% of the cores "
        "during it (default: 2; the last attempt is kept either way)",
    )
    p.add_argument(
        "--no-warmup", action="store_true", help="skip the untimed warm-up of both paths"
    )
    p.add_argument(
        "--step-profile",
        action="store_true",
        help="also time single KV-cached decode steps per batch size (the batching ceiling)",
    )
    p.add_argument("--json", metavar="PATH", help="also write every measurement to this JSON file")
    args = p.parse_args(argv)
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        args.batch_sizes = list(dict.fromkeys(sizes))  # in order, without repeats
    except ValueError:
        p.error(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        p.error("--batch-sizes needs at least one size >= 1")
    args.modes = list(dict.fromkeys(m.strip() for m in args.modes.split(",") if m.strip()))
    if not args.modes or not set(args.modes) <= {"static", "continuous"}:
        p.error(f"--modes takes static and/or continuous, got {','.join(args.modes)!r}")
    args.loop_problems = min(args.loop_problems or args.problems, args.problems)
    for name in ("problems", "max_tokens", "repeats", "loop_problems"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    from collabrl.data.benchmarks import load_benchmark
    from collabrl.data.prompts import get_prompt
    from collabrl.engines.base import SamplingParams
    from collabrl.engines.hf import TransformersEngine
    from collabrl.models import load_model, load_tokenizer, resolve_model

    command = (
        shlex.join([os.path.relpath(sys.executable), *sys.argv])
        if argv is None
        else shlex.join(argv)
    )
    cores = os.cpu_count() or 1
    print(f"command: {command}")
    print(f"machine: {machine_line()}")
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"torch.get_num_threads() = {torch.get_num_threads()}"
    )

    ref = resolve_model(args.model)
    raw_model = load_model(ref, dtype=args.dtype)
    tokenizer = load_tokenizer(ref)
    model = TimedModel(raw_model)
    bench = load_benchmark(args.benchmark, limit=args.problems)
    template = get_prompt(args.prompt)
    messages = [template.messages(item.problem) for item in bench.items]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    engines = {
        f"{mode} B={b}": TransformersEngine(
            model, tokenizer, batch_size=b, prefix_cache=True, continuous=mode == "continuous"
        )
        for mode in args.modes
        for b in args.batch_sizes
    }
    eos_ids = next(iter(engines.values()))._eos_ids  # the engine's own EOS set, reused by the loop

    lengths = [len(next(iter(engines.values())).encode(m)) for m in messages]
    print(
        f"model: {args.model} ({args.dtype}); data: first {len(messages)} problems of "
        f"{bench.name}, "
        f"prompt template '{template.name}' via the chat template; prompt tokens "
        f"min/median/max {min(lengths)}/{int(statistics.median(lengths))}/{max(lengths)}"
    )
    print(
        f"greedy, max_tokens={args.max_tokens}, EOS ids {eos_ids}, "
        f"pad id {tokenizer.pad_token_id}, "
        f"no stop strings; repeats={args.repeats} (interleaved), medians reported; the "
        f"per-sample loop runs on the first {args.loop_problems} problems\n"
    )

    if not args.no_warmup:  # first calls pay one-off allocation and kernel selection costs
        short = argparse.Namespace(max_tokens=4)
        run_loop(model, tokenizer, messages[:1], short, eos_ids, -1)
        for label, engine in engines.items():
            warm = SamplingParams(max_tokens=4)
            run_batched(label, engine, model, messages[: engine.batch_size], warm, -1)

    configs = ["per-sample loop", *engines]

    def measure(fn, *fn_args) -> Run:
        for attempt in range(args.redo_disturbed + 1):
            if args.wait_idle > 0:
                wait_for_idle(cores, args.wait_idle)
            run = fn(*fn_args)
            run.redone = attempt
            _progress(run)
            if not _disturbed(run, cores):
                break
            if attempt < args.redo_disturbed:
                print("    (other processes were busy: measuring again)", flush=True)
        return run

    runs: list[Run] = []
    for rep in range(args.repeats):
        looped = messages[: args.loop_problems]
        runs.append(measure(run_loop, model, tokenizer, looped, args, eos_ids, rep))
        for label, engine in engines.items():
            runs.append(measure(run_batched, label, engine, model, messages, params, rep))
    print()

    summaries = summarize(runs, configs, cores)
    print_table(summaries)
    print_checks(runs, configs, cores)
    print_breakdown(runs, configs)

    profile = None
    if args.step_profile:
        context = int(statistics.median(lengths)) + args.max_tokens // 2
        profile = step_profile(
            raw_model,
            args.batch_sizes,
            context,
            steps=16,
            rounds=max(2, args.repeats),
            before=lambda: args.wait_idle > 0 and wait_for_idle(cores, args.wait_idle),
        )
        print(
            f"\nforward-pass ceiling: one KV-cached decode step, context {context} "
            "(median of interleaved rounds)"
        )
        for b, t in profile.items():
            print(
                f"  batch {b:>3}: {t * 1000:7.1f} ms/step  {b / t:7.1f} tokens/s  "
                f"ceiling {b * profile[1] / t:5.2f}x"
            )

    verdicts = [
        f"{s.config} {s.ratio:.2f}x ({'meets' if s.ratio >= TARGET_RATIO else 'misses'})"
        for s, engine in zip(summaries[1:], engines.values(), strict=True)
        if engine.batch_size >= TARGET_MIN_BATCH
    ]
    print(
        f"\nresult vs the >= {TARGET_RATIO:.0f}x target at batch >= {TARGET_MIN_BATCH}: "
        + ("; ".join(verdicts) if verdicts else "no batch size >= 8 measured")
    )

    if args.json:
        payload = {
            "command": command,
            "machine": machine_line(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "summaries": [asdict(s) for s in summaries],
            "runs": [{k: v for k, v in asdict(r).items() if k != "per_prompt_ids"} for r in runs],
            "step_profile_s": profile,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


def _progress(run: Run) -> None:
    other = "" if run.other_cpu is None else f", other processes {run.other_cpu:.2f} cores"
    print(
        f"  [repeat {run.repeat}] {run.config:<16} {run.tokens:5d} tokens {run.seconds:7.1f}s "
        f"{run.tokens_per_s:7.1f} tok/s (this process {run.own_cpu:.2f} cores{other})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
