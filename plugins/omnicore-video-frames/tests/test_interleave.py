"""Video parts in chat JSONL, through omnicore's data path: several videos in one sample interleaved
with text, each a run of ``num_tokens`` placeholders, batched in order of appearance."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch

from omnicore.api import byte_tokenizer
from omnicore.testing import ChatProcessor, SampleError, collate, encoder_token, prepare_tokenizer, read_jsonl
from omnicore_video_frames.encoder import build

H = 16
OPTS = {
    "config": dict(depth=1, embed_dim=16, num_heads=2, mlp_ratio=2, hidden_size=16, patch_size=4, spatial_merge_size=2),
    "fps": 4,
    "max_frames": 8,
}


def write_video(path, frames: np.ndarray, fps: int) -> None:
    """RGB frames [T, H, W, 3] as lossless FFV1 (bgr0) in Matroska."""
    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


def runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``token`` in ``ids``."""
    out, i = [], 0
    while i < len(ids):
        if ids[i] == token:
            j = i
            while j < len(ids) and ids[j] == token:
                j += 1
            out.append((i, j - i))
            i = j
        else:
            i += 1
    return out


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    write_video(tmp_path / "a.mkv", rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8), 4)  # 8 frames kept: 4 x 4 x 4 = 64 tokens
    write_video(tmp_path / "b.mkv", rng.integers(0, 256, (5, 16, 24, 3), dtype=np.uint8), 10)  # 2 frames kept: 1 x 2 x 3 = 6 tokens
    parts = [
        {"type": "text", "text": "First "},
        {"type": "video", "path": "a.mkv"},
        {"type": "text", "text": " then "},
        {"type": "video", "path": "b.mkv"},
        {"type": "text", "text": " Same digits?"},
    ]
    lines = [
        {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "yes"}]},
        {"messages": [{"role": "user", "content": [{"type": "video", "path": "b.mkv"}]}, {"role": "assistant", "content": "2"}]},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def test_two_videos_in_one_sample(data):
    samples = read_jsonl(data / "d.jsonl")
    assert [p.type for p in samples[0].messages[0].parts] == ["text", "video", "text", "video", "text"]
    assert samples[0].messages[0].parts[1].value == str(data / "a.mkv")
    torch.manual_seed(0)
    enc = build(OPTS, hidden_size=H).eval()
    tok = prepare_tokenizer(byte_tokenizer(), ["video"], [])
    chat = ChatProcessor(tok, {"video": enc.processor}, {}, chat_template="chatml")
    pad = tok.convert_tokens_to_ids(encoder_token("video"))
    first, second = chat.encode(samples[0]), chat.encode(samples[1])
    assert [n for _, n in runs(first.input_ids, pad)] == [64, 6]
    assert [n for _, n in runs(second.input_ids, pad)] == [6]
    (s0, n0), (s1, _) = runs(first.input_ids, pad)
    assert tok.decode(first.input_ids[s0 + n0 : s1]) == " then "
    assert [enc.processor.grid(f) for _, _, f in first.media] == [(4, 4, 4), (1, 2, 3)]
    batch = collate([first, second], {"video": enc.processor}, {})
    assert batch.encoder_inputs["video"]["video_grid_thw"].tolist() == [[4, 8, 8], [1, 4, 6], [1, 4, 6]]
    with torch.no_grad():
        rows = enc(batch.encoder_inputs["video"])
    assert rows.shape == (int((batch.input_ids == pad).sum()), H) == (76, H)
    # the second sample's clip is b.mkv again: the same rows as the first sample's second clip
    torch.testing.assert_close(rows[64:70], rows[70:76], atol=0, rtol=0)


def test_video_part_errors_name_the_line(data):
    (data / "bad.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": [{"type": "video", "path": "missing.mkv"}]}]}) + "\n"
    )
    tok = prepare_tokenizer(byte_tokenizer(), ["video"], [])
    chat = ChatProcessor(tok, {"video": build(OPTS, hidden_size=H).processor}, {}, chat_template="chatml")
    with pytest.raises(SampleError, match=rf"bad.jsonl:1: video file not found: {data / 'missing.mkv'}"):
        chat.encode(read_jsonl(data / "bad.jsonl")[0])
    (data / "junk.mkv").write_bytes(b"not a video at all")
    (data / "junk.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": [{"type": "video", "path": "junk.mkv"}]}]}) + "\n"
    )
    with pytest.raises(SampleError, match=r"junk.jsonl:1: cannot read video .*junk.mkv"):
        chat.encode(read_jsonl(data / "junk.jsonl")[0])
