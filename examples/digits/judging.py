"""What the judges of generated digits share (``judge_drawn.py``, ``judge_spoken.py``).

Both ask the trained model for each digit D = 0..9 with a fixed prompt ("Draw the digit D.", "Say
the digit D."), ``--num-samples`` sampled answers each, through ``omnicore generate``; collect the
files it wrote per digit; and tally what a judge took each answer for. A missing answer (no file
for a sample) counts as wrong.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_generate_args(p: argparse.ArgumentParser, what: str) -> None:
    """The ``score`` options both judges take: the run's config and export, the sampling, and
    config overrides passed on to ``omnicore`` (after ``--``). ``what`` names the output (``drawn``)."""
    p.add_argument("--config", required=True)
    p.add_argument("--export", required=True, help="the trained model's export folder (RUN_DIR/export)")
    p.add_argument("--out", help=f"run folder for {what}/ and {what}.json (default: the export's parent, RUN_DIR)")
    p.add_argument("--num-samples", type=int, default=10)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="config overrides passed to omnicore (after --)")


def run_dir_of(args: argparse.Namespace) -> Path:
    """Where a judge writes: ``--out``, else the export's parent (RUN_DIR)."""
    return Path(args.out or Path(args.export).parent)


def sampling_of(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling settings of a ``score`` run, as recorded in its JSON."""
    return {"num_samples": args.num_samples, "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed}


def omnicore(command: str, args: argparse.Namespace, extra: Sequence[str]) -> subprocess.CompletedProcess:
    """Run ``omnicore COMMAND CONFIG --export EXPORT EXTRA... OVERRIDES...`` (the ``omnicore`` next to
    this Python) and return it.

    Raises:
        SystemExit: if it fails, with its exit status and the end of its stderr.
    """
    cmd = [str(Path(sys.executable).with_name("omnicore")), command, args.config, "--export", args.export, *extra, *args.overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: omnicore {command} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done


def generate_per_digit(
    args: argparse.Namespace, out: Path, prompt: str, medium: str
) -> tuple[dict[int, list[Path]], dict[int, dict[str, int]]]:
    """Run ``omnicore generate`` with ``prompt.format(d=D)`` for D = 0..9 into ``out``.

    Returns ``(files, wrong)``: per digit, the files of ``medium`` it wrote
    (``generated-pP-sS-MEDIUM``, e.g. ``image-0.png``, ``audio-0.wav``; prompt P = D + 1), sorted
    by sample; and per digit, the answers of another kind (:func:`answer_kinds`), by kind."""
    extra = ["--out", str(out), "--force"]
    for d in range(10):
        extra += ["--prompt", prompt.format(d=d)]
    extra += ["--num-samples", str(args.num_samples), "--temperature", str(args.temperature), "--top-k", str(args.top_k)]
    extra += ["--seed", str(args.seed)]
    done = omnicore("generate", args, extra)
    files = {d: sorted(out.glob(f"generated-p{d + 1}-s*-{medium}"), key=_sample_number) for d in range(10)}
    return files, answer_kinds(done.stdout, medium.split("-")[0])


_ANSWER = re.compile(r"^prompt (\d+), sample (\d+): text: (.*)$")


def answer_kinds(stdout: str, modality: str) -> dict[int, dict[str, int]]:
    """Per digit (prompt P = digit + 1), how many answers held no ``modality`` output, by what they
    held instead: the other modalities they wrote (``image``; ``audio+image`` for both), or
    ``text only`` (then the text itself, quoted, as ``text only: '7'``), read from ``omnicore
    generate``'s lines (``prompt P, sample S: text: '...'``, then ``saved PATH`` per file)."""
    answers: dict[tuple[int, int], tuple[str, set[str]]] = {}
    current = None
    for line in stdout.splitlines():
        if m := _ANSWER.match(line):
            current = (int(m.group(1)), int(m.group(2)))
            answers[current] = (m.group(3), set())
        elif line.startswith("saved ") and current is not None:
            answers[current][1].add(Path(line[6:]).name.split("-")[3])  # generated-pP-sS-MODALITY-I.ext
    wrong: dict[int, dict[str, int]] = {}
    for (p, _), (text, kinds) in sorted(answers.items()):
        if modality in kinds:
            continue
        kind = "+".join(sorted(kinds)) if kinds else f"text only: {text}"
        counts = wrong.setdefault(p - 1, {})
        counts[kind] = counts.get(kind, 0) + 1
    return wrong


def _sample_number(path: Path) -> int:
    """S of ``generated-pP-sS-...``: samples in numeric order (s10 after s9)."""
    return int(path.name.split("-")[2][1:])


def tally(taken: dict[int, list[Any]], num_samples: int, made: str, wrong: dict[int, dict[str, int]] | None = None) -> dict[str, Any]:
    """Count what each digit's answers were taken for.

    Args:
        taken: per digit D, what the judge took each of its answers for (a digit, or a text answer;
            compared with D as text).
        num_samples: answers asked for per digit; fewer answers count the missing ones as wrong.
        made: the name of the per-digit count of answers (``drawn``, ``spoken``).
        wrong: per digit, the answers of another kind by kind (:func:`answer_kinds`): they are
            among the missing ones, and are named in ``wrong_kind``.

    Returns:
        ``{"recognised": share of all, "samples": count, "wrong_kind": {kind: count},
        "per_digit": {"D": {made: n, "recognised": k, "taken_for": {answer: count},
        "wrong_kind": {kind: count}}}}``.
    """
    wrong = wrong or {}
    per_digit, right, total, kinds = {}, 0, 0, {}
    for d, answers in taken.items():
        keys = [str(a) for a in answers]
        ok = keys.count(str(d))
        per_digit[str(d)] = {
            made: len(keys),
            "recognised": ok,
            "taken_for": {k: keys.count(k) for k in sorted(set(keys))},
            "wrong_kind": dict(wrong.get(d, {})),
        }
        for k, n in wrong.get(d, {}).items():
            kinds[k] = kinds.get(k, 0) + n
        right += ok
        total += max(len(keys), num_samples)
    return {"recognised": round(right / max(total, 1), 4), "samples": total, "wrong_kind": kinds, "per_digit": per_digit}


def wrong_kind_line(result: dict[str, Any], medium: str) -> str:
    """``''`` when every answer was ``medium``, else a line naming how many were not, by kind, the
    text-only ones together with up to three of their texts:
    ``95 of 100 answers were no audio (counted as wrong): image 90, text only 5 (e.g. '7', '')``."""
    kinds = result.get("wrong_kind") or {}
    if not kinds:
        return ""
    texts = {k.split(": ", 1)[1]: c for k, c in kinds.items() if k.startswith("text only: ")}
    counts = {k: c for k, c in kinds.items() if not k.startswith("text only: ")}
    if texts:
        counts["text only"] = sum(texts.values())
    parts = []
    for k, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        eg = ", ".join(t for t, _ in sorted(texts.items(), key=lambda kv: -kv[1])[:3]) if k == "text only" else ""
        parts.append(f"{k} {c}" + (f" (e.g. {eg})" if eg else ""))
    return f"{sum(kinds.values())} of {result['samples']} answers were no {medium} (counted as wrong): {', '.join(parts)}"


def per_digit_line(per_digit: dict[str, dict[str, Any]], made: str) -> str:
    """``0:9/10  1:10/10 ...``: recognised out of made, per digit."""
    return "  ".join(f"{d}:{v['recognised']}/{v[made]}" for d, v in per_digit.items())


def save_judge(judge: Path, model: Any, info: dict[str, Any]) -> None:
    """Write a fitted judge: ``JUDGE/model.safetensors`` (its weights) and ``JUDGE/judge.json`` (``info``)."""
    import json

    from safetensors.torch import save_file

    judge.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(judge / "model.safetensors"))
    (judge / "judge.json").write_text(json.dumps(info, indent=1) + "\n")


def load_judge(judge: Path, build: Any, script: str) -> Any:
    """The judge saved by :func:`save_judge` in ``judge``, built by ``build()``, in eval mode.

    Raises:
        SystemExit: when ``JUDGE/model.safetensors`` is missing, naming the command that fits it
        (``python SCRIPT fit --judge JUDGE``).
    """
    from safetensors.torch import load_file

    path = judge / "model.safetensors"
    if not path.is_file():
        raise SystemExit(f"error: {path}: no fitted judge; run: python {script} fit --judge {judge}")
    model = build()
    model.load_state_dict(load_file(str(path)))
    return model.eval()
