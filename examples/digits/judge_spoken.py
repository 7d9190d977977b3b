#!/usr/bin/env python3
"""How well the trained model says digits, judged twice: by a classifier trained apart from it, and by
the model's own ears.

Three steps, all on CPU:

``fit``
    Trains a small convolutional classifier on log-mel spectrograms (three 3x3 conv layers, the
    last max-pooled over time; the keyword-spotting CNNs of Sainath and Parada 2015 are the family)
    on the FSDD takes the omni model may see (5-24), reports its accuracy on the held-out takes
    (0-4, FSDD's test split) and saves it as ``JUDGE/model.safetensors`` with ``JUDGE/judge.json``
    (which also records the loudness and length of the held-out clips, the yardstick of ``score``'s
    acoustic facts). It never hears anything the omni model generated.
``score``
    Runs ``omnicore generate`` with "Say the digit D." for D = 0..9, ``--num-samples`` samples each,
    and judges every WAV twice: (1) the classifier (resampled to its 8 kHz), and (2) the trained omni
    model itself, asked "Which digit is spoken?" with the WAV as the audio part (``omnicore eval``
    on a JSONL of those questions, greedy, exact match). Writes ``RUN_DIR/spoken.json`` (per digit:
    how many were recognised, what they were taken for, and acoustic facts: how long the sound
    lasts, how loud it is, how many clips are near-silent) and prints the overall and per-digit rates.
``ceiling``
    The classifier's accuracy on the held-out FSDD clips as they are, and after an encode/decode
    round trip through a speech tokenizer folder (``--tokenizer``, told apart by its ``config.json``:
    an EnCodec codec or an export's audio decoder, or a MelRVQ): the best the spoken digits can score
    through that tokenizer. ``--unquantised`` (MelRVQ) also judges its log-mel through Griffin-Lim
    without codes.

Usage::

    python examples/digits/judge_spoken.py fit [--judge examples/digits/judges/spoken]
    python examples/digits/judge_spoken.py score --config examples/digits/five.yaml \\
        --export runs/digits5/export [--num-samples 10 --temperature 1.0 --top-k 0 --seed 0]
    python examples/digits/judge_spoken.py ceiling --tokenizer examples/digits/mel [--unquantised]

Features: mono at 8 kHz (FSDD's rate), a 256-point STFT (Hann window, hop 80 = 10 ms), power mapped
to 40 mel bands (20 Hz-4 kHz, Slaney scale: ``transformers.audio_utils.mel_filter_bank``), in dB
relative to the clip's loudest bin and floored 80 dB below it (so the clip's level does not matter),
cropped to start 5 frames before the first frame within 40 dB of the loudest, padded or cut to 1.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_data import DEFAULT_RAW, FSDD_TEST_TAKES, FSDD_TRAIN_TAKES, load_fsdd  # noqa: E402
from judging import (  # noqa: E402
    add_generate_args,
    generate_per_digit,
    load_judge,
    omnicore,
    per_digit_line,
    run_dir_of,
    sampling_of,
    save_judge,
    tally,
    wrong_kind_line,
)

DEFAULT_JUDGE = HERE / "judges" / "spoken"  # shipped fitted (a fresh clone need not fit it); `fit` writes it again
PROMPT = "Say the digit {d}."
QUESTION = "Which digit is spoken?"

RATE = 8000  # Hz: the judge hears what FSDD recorded
N_FFT = 256
HOP = 80
N_MELS = 40
FRAMES = 120  # 1.2 s: 99% of FSDD clips are under 0.93 s
FLOOR_DB = -80.0
ONSET_DB = -40.0  # a frame within this of the loudest bin starts the sound
LEAD_FRAMES = 5

FACT_FRAME = 0.02  # s: frames of the acoustic facts
SOUND_DB = 30.0  # a frame within this of the clip's loudest frame is "sound"
SILENT_DBFS = -50.0  # a clip whose loudest 20 ms are below this is near-silent (every held-out FSDD clip is louder)


# ----------------------------------------------------------------------------- features


def mel_filters():
    """``[N_FFT // 2 + 1, N_MELS]`` float32 tensor: triangular Slaney-scale filters (transformers)."""
    import torch
    from transformers.audio_utils import mel_filter_bank

    fb = mel_filter_bank(N_FFT // 2 + 1, N_MELS, 20.0, RATE / 2, RATE, norm="slaney", mel_scale="slaney")
    return torch.from_numpy(fb.astype(np.float32))


def log_mel(wave: np.ndarray, filters=None):
    """Mono samples at :data:`RATE` ``[n]`` -> ``[N_MELS, 1 + n // HOP]`` float32 dB tensor, relative to
    the loudest bin (max 0) and floored at :data:`FLOOR_DB`. Clips shorter than ``N_FFT`` are zero-padded."""
    import torch

    x = torch.as_tensor(np.asarray(wave, dtype=np.float32))
    if x.numel() < N_FFT:
        x = torch.nn.functional.pad(x, (0, N_FFT - x.numel()))
    spec = torch.stft(x, N_FFT, HOP, window=torch.hann_window(N_FFT), center=True, pad_mode="reflect", return_complex=True)
    mel = (filters if filters is not None else mel_filters()).t() @ spec.abs().pow(2)
    db = 10.0 * torch.log10(mel.clamp_min(1e-10))
    return (db - db.max()).clamp_min(FLOOR_DB)


def judge_input(db) -> Any:
    """A :func:`log_mel` spectrogram -> the judge's input ``[N_MELS, FRAMES]`` in about [-1, 1]:
    started :data:`LEAD_FRAMES` before the first frame within :data:`ONSET_DB` of the loudest, cut or
    padded (with the floor) to :data:`FRAMES`."""
    import torch

    loud = torch.nonzero(db.max(dim=0).values >= ONSET_DB)
    start = max(int(loud[0]) - LEAD_FRAMES, 0) if len(loud) else 0
    db = db[:, start : start + FRAMES]
    db = torch.nn.functional.pad(db, (0, FRAMES - db.shape[1]), value=FLOOR_DB)
    return db / -FLOOR_DB * 2.0 + 1.0


def clip_inputs(waves: list[np.ndarray]):
    """Clips at :data:`RATE` -> ``[N, 1, N_MELS, FRAMES]`` float32 tensor for the judge."""
    import torch

    fb = mel_filters()
    return torch.stack([judge_input(log_mel(w, fb)) for w in waves]).unsqueeze(1)


def read_wave(path: Path) -> np.ndarray:
    """A WAV as mono float32 samples at :data:`RATE` (soxr resampling; :func:`omnicore.api.resample`)."""
    from omnicore.api import load_audio, resample

    return resample(load_audio(path), RATE).samples


# ----------------------------------------------------------------------------- the classifier


def build_classifier():
    """The judge: ``[B, 1, N_MELS, FRAMES]`` -> ``[B, 10]`` logits; max-pooled over time at the end,
    so where the word sits in the clip matters little."""
    from torch import nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(1, 16),
        nn.MaxPool2d(2),
        *block(16, 32),
        nn.MaxPool2d(2),
        *block(32, 48),
        nn.AdaptiveMaxPool2d((N_MELS // 4, 1)),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(48 * (N_MELS // 4), 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def augment(xb, gen):
    """Training-time changes of a batch ``[B, 1, N_MELS, FRAMES]``: a random delay of 0-10 frames
    (floor in front) and one masked band of up to 6 mels and span of up to 10 frames per clip
    (SpecAugment, Park et al. 2019)."""
    import torch

    b = xb.shape[0]
    shift = int(torch.randint(0, 11, (1,), generator=gen))
    floor = -1.0
    xb = torch.cat([torch.full_like(xb[..., :shift], floor), xb[..., : FRAMES - shift]], dim=-1)
    f0, fw = torch.randint(0, N_MELS, (b, 1), generator=gen), torch.randint(0, 7, (b, 1), generator=gen)
    t0, tw = torch.randint(0, FRAMES, (b, 1), generator=gen), torch.randint(0, 11, (b, 1), generator=gen)
    mels, frames = torch.arange(N_MELS), torch.arange(FRAMES)
    fmask = ((mels >= f0) & (mels < f0 + fw))[:, None, :, None]
    tmask = ((frames >= t0) & (frames < t0 + tw))[:, None, None, :]
    return xb.masked_fill(fmask | tmask, floor)


def train_classifier(x, y, epochs: int, seed: int, batch_size: int = 32, lr: float = 3e-3):
    """A fresh :func:`build_classifier` trained on ``x`` ``[N, 1, N_MELS, FRAMES]``, ``y`` ``[N]``
    (Adam, cosine-decayed ``lr``, :func:`augment`), returned in eval mode."""
    import torch

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = build_classifier()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * -(-len(x) // batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for b in range(0, len(x), batch_size):
            idx = order[b : b + batch_size]
            loss = torch.nn.functional.cross_entropy(model(augment(x[idx], gen)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def predict(model, x) -> list[int]:
    """The digit the judge hears in each of ``x`` ``[N, 1, N_MELS, FRAMES]``."""
    import torch

    with torch.no_grad():
        return torch.cat([model(x[b : b + 256]).argmax(-1) for b in range(0, len(x), 256)]).tolist()


def fsdd_split(raw: Path, takes: range) -> tuple[list[np.ndarray], list[int]]:
    """The FSDD recordings of ``takes`` (8 kHz mono float32) and their digits, in file-name order."""
    rows = [(int(d), p) for d, take, p in load_fsdd(raw) if take in takes]
    return [read_wave(p) for _, p in rows], [d for d, _ in rows]


def per_digit_accuracy(pred: list[int], digits: list[int]) -> dict[str, float]:
    """Share of each digit's clips that ``pred`` gets right."""
    out = {}
    for d in range(10):
        mine = [p for p, t in zip(pred, digits) if t == d]
        out[str(d)] = round(sum(p == d for p in mine) / max(len(mine), 1), 4)
    return out


def fit(judge: Path, raw: Path, epochs: int, seed: int) -> dict:
    """Train the judge on FSDD takes 5-24, test it on takes 0-4; write the judge folder."""
    import torch

    t0 = time.perf_counter()
    waves, digits = fsdd_split(raw, FSDD_TRAIN_TAKES)
    held_waves, held = fsdd_split(raw, FSDD_TEST_TAKES)
    x, y = clip_inputs(waves), torch.tensor(digits)
    model = train_classifier(x, y, epochs, seed)
    pred = predict(model, clip_inputs(held_waves))
    info = {
        "trained_on": f"FSDD takes {FSDD_TRAIN_TAKES.start}-{FSDD_TRAIN_TAKES.stop - 1} ({len(waves)} clips)",
        "heldout": f"FSDD takes {FSDD_TEST_TAKES.start}-{FSDD_TEST_TAKES.stop - 1} ({len(held_waves)} clips)",
        "heldout_accuracy": round(sum(p == t for p, t in zip(pred, held)) / len(held), 4),
        "heldout_per_digit": per_digit_accuracy(pred, held),
        "epochs": epochs,
        "seed": seed,
        "fit_seconds": round(time.perf_counter() - t0, 1),
        "features": {"rate": RATE, "n_fft": N_FFT, "hop": HOP, "n_mels": N_MELS, "frames": FRAMES},
        "heldout_acoustics": summarise([acoustic_facts(w, RATE) for w in held_waves]),
    }
    save_judge(judge, model, info)
    return info


# ----------------------------------------------------------------------------- what a listener would hear


def acoustic_facts(wave: np.ndarray, rate: int) -> dict[str, Any]:
    """What one clip sounds like, in numbers (nobody listens here).

    Returns:
        ``seconds`` (length), ``sound_seconds`` (time in 20 ms frames within 30 dB of the loudest
        frame: the word, without the silence around it; 0 for a near-silent clip), ``loudest_dbfs``
        (RMS of the loudest 20 ms, dB re full scale), ``rms_dbfs`` (of the sound frames),
        ``clipped`` (share of samples at |x| >= 0.99) and ``near_silent`` (loudest 20 ms under
        :data:`SILENT_DBFS`).
    """
    x = np.asarray(wave, dtype=np.float64)
    hop = int(rate * FACT_FRAME)
    n = max(len(x) // hop, 1)
    frames = np.pad(x, (0, max(n * hop - len(x), 0)))[: n * hop].reshape(n, hop)
    power = (frames**2).mean(axis=1)
    db = 10 * np.log10(power + 1e-12)
    loudest = float(db.max())
    sound = db >= loudest - SOUND_DB
    silent = loudest < SILENT_DBFS
    return {
        "seconds": round(len(x) / rate, 3),
        "sound_seconds": 0.0 if silent else round(float(sound.sum()) * FACT_FRAME, 3),
        "loudest_dbfs": round(loudest, 1),
        "rms_dbfs": round(float(10 * np.log10(power[sound].mean() + 1e-12)), 1),
        "clipped": round(float((np.abs(x) >= 0.99).mean()), 4),
        "near_silent": bool(silent),
    }


def summarise(facts: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of :func:`acoustic_facts` over clips, and the share of near-silent ones."""
    if not facts:
        return {"clips": 0}
    out: dict[str, Any] = {"clips": len(facts), "near_silent": round(sum(f["near_silent"] for f in facts) / len(facts), 4)}
    for key in ("seconds", "sound_seconds", "loudest_dbfs", "rms_dbfs", "clipped"):
        out[f"median_{key}"] = round(float(np.median([f[key] for f in facts])), 3)
    return out


def facts_line(s: dict[str, Any]) -> str:
    """One line of :func:`summarise`'s figures."""
    if not s.get("clips"):
        return "no clips"
    return (
        f"{s['clips']} clips, near-silent {s['near_silent']:.0%}, sound {s['median_sound_seconds']:.2f} s of "
        f"{s['median_seconds']:.2f} s, loudest 20 ms {s['median_loudest_dbfs']:.1f} dBFS, "
        f"sound RMS {s['median_rms_dbfs']:.1f} dBFS, clipped samples {s['median_clipped']:.2%} (medians)"
    )


# ----------------------------------------------------------------------------- score


def hear(args: argparse.Namespace, out: Path, clips: dict[int, list[Path]]) -> dict[int, list[str]]:
    """The trained model's own answers to "Which digit is spoken?" about each clip: ``omnicore eval``
    (greedy) on ``out/heard.jsonl``, one ``audio_to_text`` row per clip; ``out/heard/eval.json``
    keeps every answer. Returns the answers per digit (text, stripped)."""
    rows = []
    for d, paths in clips.items():
        for p in paths:
            user = [{"type": "audio", "path": os.path.relpath(p, out)}, {"type": "text", "text": QUESTION}]
            answer = [{"type": "text", "text": str(d)}]
            rows.append(
                {"task": "audio_to_text", "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}
            )
    heard: dict[int, list[str]] = {d: [] for d in clips}
    if not rows:
        return heard
    jsonl = (out / "heard.jsonl").resolve()
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = ["--generate.temperature", "0", "--data.eval", str(jsonl), "--run.output_dir", str((out / "heard").resolve())]
    omnicore("eval", args, extra)
    for row in json.loads((out / "heard" / "eval.json").read_text())["samples"]:
        heard[int(row["expected"])].append(row["answer"])
    return heard


def score(args: argparse.Namespace) -> dict:
    """Generate, judge (classifier, then the model's own ears), measure and write ``spoken.json``;
    returns its content."""
    model = load_judge(Path(args.judge), build_classifier, Path(__file__).name)
    run_dir = run_dir_of(args)
    out = run_dir / "spoken"
    shutil.rmtree(out, ignore_errors=True)  # our own folder: no clip of an earlier score is counted
    clips, wrong = generate_per_digit(args, out, PROMPT, "audio-0.wav")
    taken, facts = {}, {}
    for d, paths in clips.items():
        waves = [read_wave(p) for p in paths]
        taken[d] = predict(model, clip_inputs(waves)) if waves else []
        facts[d] = [acoustic_facts(w, RATE) for w in waves]
    judged = tally(taken, args.num_samples, "spoken", wrong)
    for d, f in facts.items():
        judged["per_digit"][str(d)]["acoustics"] = summarise(f)
    result = {
        "recognised": judged.pop("recognised"),
        "samples": judged["samples"],
        "wrong_kind": judged["wrong_kind"],
        "heard_by_model": tally(hear(args, out, clips), args.num_samples, "spoken", wrong),
        "acoustics": summarise([f for fs in facts.values() for f in fs]),
        "sampling": sampling_of(args),
        "judge": json.loads((Path(args.judge) / "judge.json").read_text()),
        "per_digit": judged["per_digit"],
    }
    (run_dir / "spoken.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ----------------------------------------------------------------------------- ceiling


def tokenizer_kind(folder: Path) -> str:
    """``"encodec"`` or ``"mel_rvq"``: the ``model_type`` of ``folder/config.json``.

    Raises:
        SystemExit: naming the folder when it has no readable ``config.json`` or another model type.
    """
    file = folder / "config.json"
    try:
        kind = json.loads(file.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise SystemExit(f"error: {file}: cannot read a speech tokenizer's config.json ({exc})") from exc
    if kind not in ("encodec", "mel_rvq"):
        raise SystemExit(f"error: {file} has model_type {kind!r}; the ceiling takes an EnCodec ('encodec') or MelRVQ ('mel_rvq') folder")
    return kind


def load_codec_decoder(folder: Path, bandwidth: float | None):
    """The ``encodec`` decoder of an EnCodec folder (a fitted codec, or an export's audio decoder,
    whose saved bandwidth is then used unless ``bandwidth`` is given)."""
    from omnicore.api import load_extra_weights
    from omnicore_audio_codec.decoder import build

    meta = load_extra_weights(folder, None, component="decoder/encodec", required=False) or {}
    options: dict[str, Any] = {"checkpoint": str(folder)}
    if bandwidth is not None:
        options["bandwidth"] = bandwidth
    return build(options, hidden_size=int(meta.get("hidden_size", 8))).eval()


class SpeechTokenizer:
    """A speech tokenizer folder as the ceiling uses it: ``round_trip(wave)`` of a clip at
    :data:`RATE` through codes and back (at :data:`RATE`), and what it costs (``facts``). An EnCodec
    folder goes through the ``encodec`` decoder (``encode_rvq``, then ``decode`` as generation decodes:
    16 kHz, clamped); a MelRVQ folder through ``MelRVQ.encode`` and ``decode`` (Griffin-Lim)."""

    def __init__(self, folder: Path, bandwidth: float | None) -> None:
        self.kind = tokenizer_kind(folder)
        if self.kind == "encodec":
            self.model = load_codec_decoder(folder, bandwidth)
            rate, hop = self.model.sample_rate, self.model.processor.hop_length
            self.facts = {"bandwidth": self.model.bandwidth, "frames_per_second": rate / hop, "codes_per_frame": self.model.num_quantizers}
        else:
            from omnicore_audio_mel.tokenizer import MelRVQ

            self.model = MelRVQ.from_pretrained(folder)
            c = self.model.config
            self.facts = {"frames_per_second": c.frames_per_second, "codes_per_frame": c.num_codebooks}
            self.facts.update(n_mels=c.n_mels, stack=c.stack, codebook_size=c.codebook_size)
        self.sample_rate = self.model.sample_rate if self.kind == "encodec" else self.model.config.sample_rate

    def round_trip(self, wave: np.ndarray, quantised: bool = True) -> np.ndarray:
        """A clip at :data:`RATE` resampled to the tokenizer's rate, encoded, decoded, back at :data:`RATE`;
        ``quantised=False`` (MelRVQ only): its log-mel straight to Griffin-Lim, no codes."""
        import torch

        from omnicore.api import Audio, resample

        x = torch.from_numpy(np.ascontiguousarray(resample(Audio(np.asarray(wave, dtype=np.float32), RATE), self.sample_rate).samples))
        if self.kind == "encodec":
            out = self.model.decode(self.model.flatten(self.model.encode_rvq(x)))
        else:
            y = self.model.decode(self.model.encode(x)) if quantised else self.model.synthesise(self.model.log_mel(x))
            out = Audio(y.numpy(), self.sample_rate)
        return resample(out, RATE).samples


def ceiling(args: argparse.Namespace) -> dict:
    """The judge on the held-out FSDD clips as they are and through the tokenizer (and, with
    ``--unquantised``, through a MelRVQ's log-mel and Griffin-Lim without codes); writes ``--out``."""
    model = load_judge(Path(args.judge), build_classifier, Path(__file__).name)
    tok = SpeechTokenizer(Path(args.tokenizer), args.bandwidth)
    if args.unquantised and tok.kind != "mel_rvq":
        raise SystemExit(f"error: --unquantised needs a MelRVQ folder; {args.tokenizer} is {tok.kind}")
    waves, digits = fsdd_split(Path(args.raw), FSDD_TEST_TAKES)
    result: dict[str, Any] = {"tokenizer": str(args.tokenizer), "model_type": tok.kind, **tok.facts, "clips": len(waves)}
    runs = [("as_is", waves), ("through_tokenizer", [tok.round_trip(w) for w in waves])]
    if args.unquantised:
        runs.append(("unquantised", [tok.round_trip(w, quantised=False) for w in waves]))
    for name, clips in runs:
        pred = predict(model, clip_inputs(clips))
        result[name] = {
            "accuracy": round(sum(p == t for p, t in zip(pred, digits)) / len(digits), 4),
            "per_digit": per_digit_accuracy(pred, digits),
            "acoustics": summarise([acoustic_facts(c, RATE) for c in clips]),
        }
    out = Path(args.out or Path(args.judge) / "ceiling.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


# ----------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="train the judge on FSDD takes 5-24")
    f.add_argument("--judge", default=str(DEFAULT_JUDGE))
    f.add_argument("--raw", default=str(DEFAULT_RAW))
    f.add_argument("--epochs", type=int, default=20)
    f.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("score", help="generate 'Say the digit D.' and judge the clips")
    s.add_argument("--judge", default=str(DEFAULT_JUDGE))
    add_generate_args(s, "spoken")
    c = sub.add_parser("ceiling", help="the judge on held-out FSDD clips, as they are and through a speech tokenizer")
    c.add_argument("--judge", default=str(DEFAULT_JUDGE))
    c.add_argument(
        "--tokenizer",
        "--codec",
        dest="tokenizer",
        required=True,
        help="a speech tokenizer folder, told apart by its config.json: EnCodec (a fitted codec or an export's audio decoder) or MelRVQ",
    )
    c.add_argument("--bandwidth", type=float, help="EnCodec: kbps (default: the folder's saved one, else the smallest)")
    c.add_argument("--unquantised", action="store_true", help="MelRVQ: also judge its log-mel through Griffin-Lim without codes")
    c.add_argument("--raw", default=str(DEFAULT_RAW))
    c.add_argument("--out", help="JSON to write (default: JUDGE/ceiling.json)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.cmd == "fit":
        info = fit(Path(args.judge), Path(args.raw), args.epochs, args.seed)
        per = "  ".join(f"{d}:{a:.2f}" for d, a in info["heldout_per_digit"].items())
        print(f"judge: held-out accuracy {info['heldout_accuracy']:.4f} on {info['heldout']} ({info['fit_seconds']} s; {per})")
        return 0
    if args.cmd == "ceiling":
        r = ceiling(args)
        cost = f"{r['frames_per_second']:g} frames/s x {r['codes_per_frame']} codes"
        print(f"{r['tokenizer']}: {r['model_type']}, {cost}")
        for name in ("as_is", "through_tokenizer", "unquantised"):
            if name not in r:
                continue
            per = "  ".join(f"{d}:{a:.2f}" for d, a in r[name]["per_digit"].items())
            print(f"held-out FSDD {name.replace('_', ' ')}: judge accuracy {r[name]['accuracy']:.4f} ({per})")
            print(f"  {facts_line(r[name]['acoustics'])}")
        return 0
    r = score(args)
    heard = r["heard_by_model"]
    print(f"spoken digits recognised by the judge: {r['recognised']:.3f} of {r['samples']} ({per_digit_line(r['per_digit'], 'spoken')})")
    if line := wrong_kind_line(r, "audio"):
        print(f"  {line}")
    print(
        f"spoken digits heard by the model itself: {heard['recognised']:.3f} of {heard['samples']} ({per_digit_line(heard['per_digit'], 'spoken')})"
    )
    print(f"what a listener would hear: {facts_line(r['acoustics'])}")
    print(f"  FSDD held-out clips, for comparison: {facts_line(r['judge']['heldout_acoustics'])}")
    for d, v in r["per_digit"].items():
        a = v["acoustics"]
        if a.get("clips"):
            print(
                f"  {d}: sound {a['median_sound_seconds']:.2f} s, loudest {a['median_loudest_dbfs']:.1f} dBFS, near-silent {a['near_silent']:.0%}, taken for {v['taken_for']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
