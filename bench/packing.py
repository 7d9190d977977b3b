"""The packer as training runs it: a stream of samples packed window by window (``data.packing_window``
samples a window) by :func:`omnicore.data.packing.pack_rows`, which packs each window through
``pack_window`` as every data shard's windows are packed, for both ``data.packing`` methods; against
the textbook first-fit scan over the open rows (quadratic in the rows open at once).

    .venv/bin/python bench/packing.py [--samples 65536] [--windows 1024,4096,16384,65536] [--scan-up-to 4096]

Lengths are log-normal around 250 tokens (sigma 1.0, clipped to [8, budget]), budget 4096 tokens, in
one seeded order. Per window size and method: the rows, the seconds for the whole stream, the
microseconds per sample and the budget fill waste ``1 - real / (rows x budget)``. The scan runs
first_fit window by window for windows up to ``--scan-up-to`` and must give the same rows. Writes
``bench/results/packing.json``.
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


class _Len:
    """A sample as the packer sees it: a length (``len()``) and a ``where`` for errors."""

    def __init__(self, n: int, where: str):
        self.n, self.where = n, where

    def __len__(self) -> int:
        return self.n


def scan_first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit by scanning the open rows in order for each sample (the quadratic reference)."""
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
    from omnicore.data.packing import PACKING_METHODS, pack_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=65536, help="samples in the stream")
    ap.add_argument("--windows", default="1024,4096,16384,65536", help="data.packing_window values (1024 is the default)")
    ap.add_argument("--scan-up-to", type=int, default=4096, help="largest window the quadratic scan runs on")
    ap.add_argument("--budget", type=int, default=4096, help="data.max_tokens")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "packing.json"))
    a = ap.parse_args(argv)
    rng = random.Random(0)
    lengths = [min(a.budget, max(8, int(rng.lognormvariate(math.log(250), 1.0)))) for _ in range(a.samples)]
    samples = [_Len(n, f"sample {i}") for i, n in enumerate(lengths)]
    real = sum(lengths)
    rows = []
    for window in [int(x) for x in a.windows.split(",")]:
        for method in PACKING_METHODS:
            t = time.perf_counter()
            packed = list(pack_rows(samples, a.budget, window=window, method=method))
            s = time.perf_counter() - t
            row = {
                "window": window,
                "method": method,
                "rows": len(packed),
                "seconds": round(s, 4),
                "us_per_sample": round(1e6 * s / a.samples, 2),
                "budget_fill_waste": round(1 - real / (len(packed) * a.budget), 5),
            }
            if method == "first_fit" and window <= a.scan_up_to:
                t = time.perf_counter()
                scanned = [
                    [samples[start + j] for j in b]
                    for start in range(0, a.samples, window)
                    for b in scan_first_fit(lengths[start : start + window], a.budget)
                ]
                row["scan_seconds"] = round(time.perf_counter() - t, 4)
                assert scanned == packed, f"window {window}: the scan's rows differ from the packer's"
            rows.append(row)
            print(row, flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"samples": a.samples, "budget": a.budget, "rows": rows}, indent=1) + "\n")
    print(f"{a.samples} samples, budget {a.budget} tokens")
    print("| data.packing_window | data.packing | rows | seconds | us per sample | budget fill waste | scan seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['window']} | {r['method']} | {r['rows']} | {r['seconds']} | {r['us_per_sample']} | "
            f"{100 * r['budget_fill_waste']:.2f}% | {r.get('scan_seconds', '-')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
