"""Peak memory and time of the text loss: ``torch_cross_entropy`` vs ``chunked_cross_entropy``.

One forward + backward of ``linear_cross_entropy_sum(hidden [N, H], weight [V, H], labels [N])``
(fp32, 10% of labels ignored), each kernel in a fresh subprocess so that the peak resident memory
(``ru_maxrss``) is its own. ``extra_peak_mib`` is the peak RSS during the call minus the RSS before it
(inputs already allocated and touched); ``time_s`` is the median of ``--repeats`` calls after that
first one. The whole-logits loss needs ``N x V`` fp32 logits plus their log-softmax and gradient
(3 x 500 MiB at the default sizes); the chunked one ``chunk x V`` fp32 plus a ``[V, H]`` fp32
gradient accumulator and the ``[N, H]`` gradient.

Usage::

    .venv/bin/python bench/ce_memory.py [--n 4096] [--hidden 256] [--vocab 32000] [--chunk 1024]
                                        [--repeats 3] [--threads 1]

Writes ``bench/results/ce_memory.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one(kernel: str, n: int, h: int, v: int, chunk: int, repeats: int, threads: int) -> dict:
    import torch

    from omnicore.kernels.cross_entropy import ChunkedCrossEntropy, TorchCrossEntropy

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.05).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::10] = -100
    k = TorchCrossEntropy() if kernel == "torch_cross_entropy" else ChunkedCrossEntropy({"chunk_size": chunk})

    def step() -> float:
        hidden.grad = weight.grad = None
        loss = k.linear_cross_entropy_sum(hidden, weight, labels)
        loss.backward()
        return loss.item()

    before = _rss_mib()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    loss = step()
    first = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {
        "kernel": kernel,
        "loss": loss,
        "grad_hidden_norm": hidden.grad.norm().item(),
        "grad_weight_norm": weight.grad.norm().item(),
        "extra_peak_mib": round(max(peak, peak_before) - before, 1),
        "first_call_s": round(first, 3),
        "time_s": round(statistics.median(times), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(one(a.worker, a.n, a.hidden, a.vocab, a.chunk, a.repeats, a.threads)))
        return
    rows = []
    for kernel in ("torch_cross_entropy", "chunked_cross_entropy"):
        cmd = [sys.executable, __file__, "--worker", kernel] + [
            f"--{k}={getattr(a, k)}" for k in ("n", "hidden", "vocab", "chunk", "repeats", "threads")
        ]
        r = subprocess.run(
            cmd, capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": str(a.threads), "PATH": "/usr/bin:/bin"}
        )
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    logits_mib = a.n * a.vocab * 4 / 2**20
    print(f"N={a.n} H={a.hidden} V={a.vocab} fp32, chunk {a.chunk}, {a.threads} thread(s); one [N, V] fp32 logits = {logits_mib:.0f} MiB")
    print(f"{'kernel':<24}{'extra peak MiB':>16}{'time s':>10}{'loss':>16}")
    for r in rows:
        print(f"{r['kernel']:<24}{r['extra_peak_mib']:>16.1f}{r['time_s']:>10.3f}{r['loss']:>16.4f}")
    out = {
        "what": "one forward+backward of linear_cross_entropy_sum on CPU, fresh process per kernel",
        "n": a.n,
        "hidden": a.hidden,
        "vocab": a.vocab,
        "chunk": a.chunk,
        "threads": a.threads,
        "repeats": a.repeats,
        "logits_fp32_mib": round(logits_mib, 1),
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
    }
    dest = ROOT / "bench" / "results" / "ce_memory.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {dest.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
