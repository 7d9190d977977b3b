"""First-fit packing time against the number of samples: the scan over open bins (quadratic) and
omnicore's free-space index (``O(n log B)``, :class:`omnicore.data.packing.FreeSpaceIndex`).

    .venv/bin/python bench/packing.py [--sizes 5000,20000,80000,320000] [--scan-up-to 20000]

Lengths are log-normal around 250 tokens (sigma 1.0, clipped to [8, budget]), budget 4096 tokens;
both produce the same bins (checked on every size the scan runs). Writes
``bench/results/packing.json`` with seconds per size and the growth ratio between sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scan_first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    bins: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max_tokens - n)
    return bins


def main(argv: list[str] | None = None) -> int:
    from omnicore.data.packing import pack_first_fit

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5000,20000,80000,320000")
    ap.add_argument("--scan-up-to", type=int, default=20000, help="largest size the quadratic scan runs on")
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "packing.json"))
    a = ap.parse_args(argv)
    rng = random.Random(0)
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        lengths = [min(a.budget, max(8, int(rng.lognormvariate(math.log(250), 1.0)))) for _ in range(n)]
        t = time.perf_counter()
        bins = pack_first_fit(lengths, a.budget)
        row = {"samples": n, "bins": len(bins), "index_s": round(time.perf_counter() - t, 4)}
        if n <= a.scan_up_to:
            t = time.perf_counter()
            assert scan_first_fit(lengths, a.budget) == bins
            row["scan_s"] = round(time.perf_counter() - t, 4)
        rows.append(row)
        print(row, flush=True)
    for prev, row in zip(rows, rows[1:]):
        row["index_growth"] = round(row["index_s"] / prev["index_s"], 2)
        if "scan_s" in row and "scan_s" in prev:
            row["scan_growth"] = round(row["scan_s"] / prev["scan_s"], 2)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"budget": a.budget, "rows": rows}, indent=1) + "\n")
    print("| samples | bins | free-space index s | growth | scan s | growth |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['samples']} | {r['bins']} | {r['index_s']} | {r.get('index_growth', '')} | {r.get('scan_s', '-')} | {r.get('scan_growth', '')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
