"""Evidence data: the first N training and M held-out problems of each named family of
arith or arith_steps, interleaved by family (as arith is), written as OUT/train.jsonl
and OUT/test.jsonl.

    python scripts/evidence/arith_mix.py add1,add2,mul22,add3 25 20 runs/evidence/relay
"""

import json
import sys
from pathlib import Path

families = sys.argv[1].split(",")
per_train, per_test, out = int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
out.mkdir(parents=True, exist_ok=True)
data = Path(__file__).resolve().parents[2] / "data"
for split, count in (("train", per_train), ("test", per_test)):
    rows = [
        json.loads(line)
        for source in ("arith", "arith_steps")
        for line in open(data / f"{source}_{split}.jsonl", encoding="utf-8")
    ]
    kept = []
    for family in families:
        kept += [r for r in rows if r["family"] == family][:count]
    # Interleaved by family, as arith is, so that --limit takes every family.
    kept.sort(key=lambda r: (int(r["id"].rsplit("-", 1)[1]), families.index(r["family"])))
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
    (out / f"{split}.jsonl").write_text(lines, encoding="utf-8")
    print(f"{out / split}.jsonl: {len(kept)} problems")
