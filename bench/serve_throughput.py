"""Serving speed, side by side in one run against one embedded server.

(a) Expert pool: K=3 parallel calls (EAPO's panel) vs one call — the wall
    time ratio, target <= 1.3x (the server batches the three together).
(b) Embedded server: 8 concurrent clients vs the same 8 requests sent one by
    one — the throughput ratio, target >= 3x.

Measurements alternate (one, parallel, one, parallel, ...) for `--repeats`
rounds and medians are reported, so machine noise falls on both sides.

    python bench/serve_throughput.py                  # smollm2-135m, greedy
    python bench/serve_throughput.py --max-tokens 64 --repeats 5
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.servers

from collabrl.config import PoolConfig  # noqa: E402
from collabrl.data.benchmarks import load_benchmark  # noqa: E402
from collabrl.engines.base import SamplingParams  # noqa: E402
from collabrl.engines.pool import ExpertPool  # noqa: E402
from tests.servers import ServerProcess  # noqa: E402

POOL_TARGET = 1.3
SERVER_TARGET = 3.0


def questions(count: int) -> list[list[dict[str, str]]]:
    items = load_benchmark("gsm8k", limit=count).items
    return [[{"role": "user", "content": item.problem}] for item in items]


def time_pool(pool: ExpertPool, prompts, params: SamplingParams) -> float:
    began = time.perf_counter()
    records = pool.ask_sync([(i + 1, p) for i, p in enumerate(prompts)], params)
    elapsed = time.perf_counter() - began
    failed = [r.error for r in records if not r.ok]
    if failed:
        raise RuntimeError(f"pool calls failed: {failed}")
    return elapsed


def time_requests(url: str, prompts, max_tokens: int, concurrent: bool) -> tuple[float, int]:
    import openai

    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=600)

    def ask(messages) -> int:
        reply = client.chat.completions.create(
            model="expert", messages=messages, max_tokens=max_tokens, temperature=0
        )
        return reply.usage.completion_tokens

    began = time.perf_counter()
    if concurrent:
        with ThreadPoolExecutor(len(prompts)) as threads:
            tokens = sum(threads.map(ask, prompts))
    else:
        tokens = sum(ask(p) for p in prompts)
    return time.perf_counter() - began, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    print("command: python " + shlex.join(sys.argv))

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    panel = questions(3)
    batch = questions(args.clients)
    with ServerProcess(args.model, extra=("--batch-size", "16")) as server:
        print(f"server: {server.url} ({args.model}, embedded, batch <= 16)")
        pool = ExpertPool(PoolConfig(endpoints=[server.url], num_experts=3, timeout=600))
        time_pool(pool, panel[:1], params)  # warm-up: connections, first-call costs
        one, three, three_seq, seq, par = [], [], [], [], []
        seq_tokens = par_tokens = 0
        for _ in range(args.repeats):
            one.append(time_pool(pool, panel[:1], params))
            three.append(time_pool(pool, panel, params))
            three_seq.append(sum(time_pool(pool, [p], params) for p in panel))
            s, seq_tokens = time_requests(server.url, batch, args.max_tokens, concurrent=False)
            p, par_tokens = time_requests(server.url, batch, args.max_tokens, concurrent=True)
            seq.append(s)
            par.append(p)
        pool.close()

    m_one, m_three = statistics.median(one), statistics.median(three)
    m_seq, m_par = statistics.median(seq), statistics.median(par)
    pool_ratio = m_three / m_one
    server_ratio = (par_tokens / m_par) / (seq_tokens / m_seq)
    print(f"\n(a) expert pool, greedy, max_tokens={args.max_tokens}, medians of {args.repeats}")
    print(f"    1 call          {m_one:7.2f} s")
    print(f"    3 parallel      {m_three:7.2f} s")
    print(f"    3 one by one    {statistics.median(three_seq):7.2f} s  (for reference)")
    verdict = "meets" if pool_ratio <= POOL_TARGET else "misses"
    print(f"    ratio 3/1       {pool_ratio:7.2f}x  ({verdict} target <= {POOL_TARGET}x)")
    print(f"\n(b) embedded server, {args.clients} requests, medians of {args.repeats}")
    print(f"    one by one      {m_seq:7.2f} s  {seq_tokens / m_seq:7.1f} tok/s ({seq_tokens} tok)")
    print(f"    concurrent      {m_par:7.2f} s  {par_tokens / m_par:7.1f} tok/s ({par_tokens} tok)")
    verdict = "meets" if server_ratio >= SERVER_TARGET else "misses"
    print(f"    throughput      {server_ratio:7.2f}x  ({verdict} target >= {SERVER_TARGET}x)")


if __name__ == "__main__":
    main()
