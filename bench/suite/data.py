"""Benchmark samples: real text cut to documented variable lengths, and the digits samples' lengths.

Text samples
    The text is the repository's own prose (the markdown files in :data:`CORPUS`: READMEs, the
    plugin guide and the digits data licences), read as UTF-8 bytes and walked through with a
    cursor that wraps around. Each sample is one chat turn pair::

        {"messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]},
                      {"role": "assistant", "content": [{"type": "text", "text": RESPONSE}]}]}

    The byte lengths of PROMPT and RESPONSE are drawn independently from log-normal distributions
    whose *means* are LMSYS-Chat-1M's average prompt and response lengths, 69.5 and 214.5 tokens
    (Zheng et al. 2023, "LMSYS-Chat-1M: A Large-Scale Real-World LLM Conversation Dataset",
    arXiv:2309.11998, Table 1), read here as byte tokens (omnicore's built-in byte tokenizer: one
    token per UTF-8 byte). The spread, sigma = 1.0 of the log (median = mean / e^(sigma^2 / 2),
    so medians of 42.2 and 130.1; the 90th percentile is 3.6x the median), is *our assumption*,
    not a cited figure: chat-length distributions are right-skewed with a long tail, and
    sigma = 1 is a plain round choice. Each drawn length is at least 1 byte; a sample that would not
    fit ``max_tokens`` after the chat template has its response shortened to fit (so the tail is
    clipped at the budget). Padding waste grows with the spread; ``run.py`` records the measured
    token-length statistics next to every figure.

Digits samples
    ``examples/digits/data/train.jsonl`` (built by ``examples/digits/build_data.py``, git-ignored):
    image -> text, audio -> text and text -> image samples, tokenised by omnicore's ChatProcessor
    with the digits config's encoders and decoder, so each length counts the placeholder tokens of
    the media (16 per 28x28 image; audio by duration; image codes for generation targets).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DIGITS_CONFIG = ROOT / "examples" / "digits" / "config.yaml"
DIGITS_TRAIN = ROOT / "examples" / "digits" / "data" / "train.jsonl"

#: repository text used as the sample source, in this order (files that are missing are skipped)
CORPUS = (
    "README.md",
    "PLUGINS.md",
    "examples/digits/README.md",
    "examples/digits/raw/LICENSES.md",
    "plugins/omnicore-audio-whisper/README.md",
    "plugins/omnicore-image-movqgan/README.md",
    "plugins/omnicore-image-siglip/README.md",
    "plugins/omnicore-parallel-ulysses/README.md",
    "plugins/omnicore-parallel-comet/README.md",
    "plugins/omnicore-kernels-flash-attn/README.md",
    "plugins/omnicore-kernels-liger/README.md",
    "contrib/omnicore-parallel-offload/README.md",
    "contrib/omnicore-plugin-template/README.md",
)

#: LMSYS-Chat-1M, Table 1: average tokens per prompt and per response
PROMPT_MEAN, RESPONSE_MEAN = 69.5, 214.5
#: assumed log-normal spread (standard deviation of the natural log of the length)
SIGMA = 1.0
#: tokens the chat template adds around one prompt/response pair (<|im_start|>user\n ... <|im_end|>\n, then the assistant turn)
TEMPLATE_TOKENS = 21


def lognormal_median(mean: float, sigma: float) -> float:
    """Median of a log-normal with this mean and log-spread: ``mean / exp(sigma^2 / 2)``."""
    return mean / math.exp(sigma * sigma / 2)


def corpus_bytes(root: Path = ROOT) -> bytes:
    """The corpus files joined by blank lines, as UTF-8 bytes."""
    parts = [(root / p).read_bytes() for p in CORPUS if (root / p).is_file()]
    if not parts:
        raise FileNotFoundError(f"none of the corpus files {CORPUS} exist under {root}")
    return b"\n\n".join(parts)


def draw_lengths(n: int, seed: int, max_tokens: int, sigma: float = SIGMA) -> list[tuple[int, int]]:
    """``n`` (prompt, response) byte lengths: log-normal with LMSYS-Chat-1M's means and ``sigma``;
    the response is shortened so that prompt + response + template fits ``max_tokens``."""
    rng = random.Random(seed)
    mu_p = math.log(lognormal_median(PROMPT_MEAN, sigma))
    mu_r = math.log(lognormal_median(RESPONSE_MEAN, sigma))
    out = []
    for _ in range(n):
        p = max(1, round(rng.lognormvariate(mu_p, sigma)))
        p = min(p, max_tokens // 2)
        r = max(1, round(rng.lognormvariate(mu_r, sigma)))
        r = min(r, max_tokens - TEMPLATE_TOKENS - p)
        out.append((p, r))
    return out


def _text(chunk: bytes) -> str:
    # a cut may split a multi-byte character; drop the pieces rather than emit replacement chars
    return chunk.decode("utf-8", errors="ignore")


def text_samples(n: int, seed: int, max_tokens: int, sigma: float = SIGMA) -> list[dict[str, Any]]:
    """``n`` chat samples in omnicore's JSONL format (see the module docstring)."""
    corpus = corpus_bytes()
    cursor = random.Random(seed + 1).randrange(len(corpus))
    samples = []
    for p, r in draw_lengths(n, seed, max_tokens, sigma):
        pieces = []
        for k in (p, r):
            if cursor + k > len(corpus):
                cursor = 0
            pieces.append(_text(corpus[cursor : cursor + k]) or " ")
            cursor += k
        samples.append(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": pieces[0]}]},
                    {"role": "assistant", "content": [{"type": "text", "text": pieces[1]}]},
                ]
            }
        )
    return samples


def write_jsonl(samples: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return path


def corpus_info() -> dict[str, Any]:
    """What the text samples are cut from and how (for the results JSON)."""
    data = corpus_bytes()
    return {
        "files": [p for p in CORPUS if (ROOT / p).is_file()],
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest()[:16],
        "prompt_len": {"dist": "lognormal", "mean": PROMPT_MEAN, "sigma": SIGMA, "median": round(lognormal_median(PROMPT_MEAN, SIGMA), 1)},
        "response_len": {
            "dist": "lognormal",
            "mean": RESPONSE_MEAN,
            "sigma": SIGMA,
            "median": round(lognormal_median(RESPONSE_MEAN, SIGMA), 1),
        },
        "means_source": "LMSYS-Chat-1M (Zheng et al. 2023, arXiv:2309.11998), Table 1: 69.5 tokens per prompt, 214.5 per response",
        "sigma_source": "assumption (not cited)",
        "unit": "byte tokens (omnicore's byte tokenizer)",
    }


def length_stats(lengths: list[int]) -> dict[str, float]:
    """Count, mean, median, 90th percentile, min and max of token lengths (tokens)."""
    s = sorted(lengths)
    return {
        "count": len(s),
        "mean": round(statistics.fmean(s), 1),
        "median": statistics.median(s),
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "min": s[0],
        "max": s[-1],
    }


def digits_lengths(limit: int | None = None) -> tuple[list[int], int] | None:
    """Real token lengths of the digits training samples and the digits config's ``max_tokens``,
    or ``None`` when ``examples/digits/data/train.jsonl`` (or its fitted MoVQ decoder) is absent.

    Encodes with the digits config's own components (random weights: only the placeholder counts
    matter, and those come from the features, e.g. the audio duration)."""
    if not DIGITS_TRAIN.is_file() or not (DIGITS_TRAIN.parent / "movq" / "config.json").is_file():
        return None
    from omnicore.config import load_config
    from omnicore.data.chat import ChatProcessor, module_processors
    from omnicore.data.jsonl import iter_jsonl
    from omnicore.model.build import build_omni_model

    cfg = load_config(DIGITS_CONFIG)
    model, tokenizer = build_omni_model(cfg)
    processor = ChatProcessor(
        tokenizer, module_processors(model.encoders, "encoder"), module_processors(model.decoders, "decoder"), cfg.data.system_prompt
    )
    encoded = [processor.encode(s) for s in itertools.islice(iter_jsonl(cfg.resolve_path(cfg.data.train)), limit)]
    return [len(s) for s in encoded], cfg.data.max_tokens
