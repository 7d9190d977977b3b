#!/usr/bin/env python3
"""Answer held-out questions with an omnicore export of a published family's fine-tune, using
transformers: ``AutoModelForImageTextToText`` reads the export folder as it reads a published
checkpoint (its ``config.json`` names the class: ``Qwen2VLForConditionalGeneration``,
``LlavaNextForConditionalGeneration``, ``Idefics3ForConditionalGeneration``, ...), the
checkpoint's own processor writes the inputs, ``generate`` answers greedily. Nothing of omnicore's
training code runs: this is what serving the fine-tune looks like anywhere transformers runs.

The processor comes from the family kit's
:func:`omnicore_family_kit.processors.load_hf_processor`: ``AutoProcessor.from_pretrained`` of the
folder, or, where torchvision is missing (transformers 5 builds several video processors on it),
the same processor class with a video processor that refuses videos; images work. Without the kit
installed, ``AutoProcessor.from_pretrained`` is used.

Usage::

    python examples/families/serve.py runs/qwen2_vl/export --data examples/families/data/eval.jsonl [--limit 8] [--max-new-tokens N]

Prints each question's expected and generated answer and the share that match. Answers stop at the
end of the turn or after ``--max-new-tokens`` tokens (default: the export's
``generation_config.json`` where it sets ``max_new_tokens``, else :data:`DEFAULT_MAX_NEW_TOKENS`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 64
"""``--max-new-tokens`` where neither the command line nor the export's generation config sets one."""


def load_processor(folder: Path) -> Any:
    """The checkpoint's processor: the family kit's ``load_hf_processor(folder)`` (images work where
    torchvision is missing), or ``AutoProcessor.from_pretrained(folder)`` where the kit is not
    installed.

    Raises:
        ValueError: the kit's loader cannot build the folder's processor (naming the reason);
            without the kit, whatever ``AutoProcessor`` raises.
    """
    try:
        from omnicore_family_kit.processors import load_hf_processor
    except ImportError:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)
    return load_hf_processor(str(folder))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", type=Path, help="the export folder (omnicore train writes <output_dir>/export)")
    ap.add_argument("--data", type=Path, required=True, help="a JSONL of chat samples with one image and a text answer")
    ap.add_argument("--limit", type=int, default=8, help="answer only the first N samples")
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        help=(
            "longest answer in tokens (generation stops earlier at the end of the turn); default: max_new_tokens of the "
            f"export's generation_config.json where it sets one, else {DEFAULT_MAX_NEW_TOKENS}. The recipe passes 8, as its "
            "config's generate.max_new_tokens"
        ),
    )
    ap.add_argument("--json", type=Path, help="also write [{where, expected, answer}] to this file")
    ap.add_argument("--device", help="where the model runs (default: cuda where torch sees a GPU, else cpu)")
    args = ap.parse_args(argv)
    if not (args.export / "config.json").is_file():
        print(f"serve.py: {args.export} has no config.json; give the export folder of a published-family run", file=sys.stderr)
        return 2

    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForImageTextToText.from_pretrained(args.export, dtype=torch.float32).to(device).eval()
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = getattr(model.generation_config, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS
    processor = load_processor(args.export)
    print(f"loaded {type(model).__name__} from {args.export} ({type(processor).__name__}, on {device})")
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()][: args.limit]
    right, answers = 0, []
    for i, row in enumerate(rows, 1):
        user = row["messages"][0]["content"]
        expected = "".join(p["text"] for p in row["messages"][1]["content"] if p["type"] == "text")
        images = [Image.open(args.data.parent / p["path"]).convert("RGB") for p in user if p["type"] == "image"]
        content = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]} for p in user]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[text], images=images, return_tensors="pt").to(device)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        answer = processor.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)[0].strip()
        right += answer == expected
        answers.append({"where": f"{args.data}:{i}", "expected": expected, "answer": answer})
        print(f"{i}: expected {expected!r}, transformers generated {answer!r}")
    print(f"transformers' answers: {right}/{len(rows)} as expected")
    if args.json:
        args.json.write_text(json.dumps(answers, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
