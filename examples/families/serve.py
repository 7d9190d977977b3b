#!/usr/bin/env python3
"""Answer held-out questions with an omnicore export of a Qwen2-VL fine-tune, using transformers
alone: ``AutoModelForImageTextToText`` and ``AutoProcessor`` read the export folder as they read
a published checkpoint (its ``config.json`` names ``Qwen2VLForConditionalGeneration`` or
``Qwen2_5_VLForConditionalGeneration``), ``generate`` answers greedily. No omnicore import: this
is what serving the fine-tune looks like anywhere transformers runs.

Usage::

    python examples/qwen2_vl/serve.py runs/qwen2_vl/export --data examples/qwen2_vl/data/eval.jsonl [--limit 8] [--max-new-tokens N]

Prints each question's expected and generated answer and the share that match. Answers stop at the
end of the turn or after ``--max-new-tokens`` tokens (default: the export's
``generation_config.json`` where it sets ``max_new_tokens``, else :data:`DEFAULT_MAX_NEW_TOKENS`).

Elsewhere, import :func:`load_processor` from this file (``from serve import load_processor`` with
this folder on ``sys.path``) to get the export's processor on a machine without torchvision.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_MAX_NEW_TOKENS = 64
"""``--max-new-tokens`` where neither the command line nor the export's generation config sets one."""


def load_processor(folder: Path):
    """``AutoProcessor.from_pretrained(folder)``; where torchvision is missing (transformers 5's
    Qwen2-VL video processor needs it, and these questions hold no video) the same processor class
    built from the folder's image processor and tokenizer, without a video processor."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return AutoProcessor.from_pretrained(folder)
    import transformers

    base = getattr(transformers, json.loads((folder / "preprocessor_config.json").read_text())["processor_class"])

    class ImagesOnly(base):
        def check_argument_for_proper_class(self, name, arg):
            if name == "video_processor" and arg is None:
                return None
            return super().check_argument_for_proper_class(name, arg)

    tok = AutoTokenizer.from_pretrained(folder)
    return ImagesOnly(
        image_processor=AutoImageProcessor.from_pretrained(folder), tokenizer=tok, video_processor=None, chat_template=tok.chat_template
    )


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
    args = ap.parse_args(argv)
    if not (args.export / "config.json").is_file():
        print(f"serve.py: {args.export} has no config.json; give the export folder of a published-family run", file=sys.stderr)
        return 2

    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(args.export, dtype=torch.float32).eval()
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = getattr(model.generation_config, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS
    processor = load_processor(args.export)
    print(f"loaded {type(model).__name__} from {args.export}")
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()][: args.limit]
    right, answers = 0, []
    for i, row in enumerate(rows, 1):
        user = row["messages"][0]["content"]
        expected = "".join(p["text"] for p in row["messages"][1]["content"] if p["type"] == "text")
        images = [Image.open(args.data.parent / p["path"]).convert("RGB") for p in user if p["type"] == "image"]
        content = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]} for p in user]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[text], images=images, return_tensors="pt")
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
