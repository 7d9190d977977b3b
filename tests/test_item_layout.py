"""An encoder item its processor writes itself (``Processor.layout`` -> ``omnicore.api.ItemLayout``):
tokens of several encoders interleaved, the items that fill them in the sample's media, and the
item's own mRoPE positions (``omnicore.data.positions.FixedRows``); and a clip's sound track read
with its frames (``load_video(..., audio=True)``, asked for by ``Processor.audio_track``). The
published Qwen2.5-Omni family checks the same path against transformers
(``plugins/omnicore-family-qwen2-5-omni/tests/test_model.py``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from omnicore.data.jsonl import Message, Part, Sample, SampleError
from omnicore.data.positions import FixedRows, RopeLayout, mrope_positions


class Sound:
    modality, placeholder, wrap = "audio", "<|audio_pad|>", ("<as>", "<ae>")

    def preprocess(self, media):
        return {"n": media}

    def num_tokens(self, f):
        return f["n"]

    def collate(self, items):
        return items


class Clip:
    """A clip of ``media`` frames and ``media + 1`` sound tokens, written frames then sound then the
    rest of the frames; both start at one position after ``<vs>``."""

    modality, placeholder, wrap = "video", "<|video_pad|>", ("<vs>", "<ve>")
    audio_track = False
    counts: tuple[int, ...] | None = None  # a wrong layout, when set
    rows: tuple | None = None

    def preprocess(self, media):
        return {"n": media, "sound": {"n": media + 1}}

    def num_tokens(self, f):
        return f["n"]

    def collate(self, items):
        return items

    def layout(self, f):
        from omnicore.api import ItemLayout

        n, a = f["n"], f["sound"]["n"]
        first = self.counts or (1, a, n - 1)
        tokens = ("<vs>", ("video", first[0]), ("audio", first[1]), ("video", first[2]), "<ve>")
        rows = (0, 1, *range(1, a + 1), *range(2, n + 1), a + 1)
        return ItemLayout(tokens, (("video", {"n": n}), ("audio", f["sound"])), self.rows or (rows, rows, rows), a + 2)


def _encode(clip, *, rope=True, audio=True, parts=None):
    import omnicore.data.chat as chat
    from omnicore.data.chat import ChatProcessor
    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    encoders = {"video": clip, **({"audio": Sound()} if audio else {})}
    tok = prepare_tokenizer(byte_tokenizer(), encoders, [], chat_template="chatml")
    proc = ChatProcessor(tok, encoders, {}, rope=RopeLayout(3, "max") if rope else None)
    old = dict(chat.LOADERS)
    chat.LOADERS.update({"video": lambda path: 3, "audio": lambda path: 2})
    parts = parts or [Part("audio", "a"), Part("video", "v"), Part("text", "ok")]
    try:
        return tok, proc.encode(Sample([Message("user", parts), Message("assistant", [Part("text", "x")])], "a.jsonl", 1))
    finally:
        chat.LOADERS.clear()
        chat.LOADERS.update(old)


def test_a_laid_out_item_writes_its_tokens_media_and_positions():
    tok, enc = _encode(Clip())
    pads = {m: f"<|{m}_pad|>" for m in ("video", "audio")}
    text = tok.decode(enc.input_ids)
    assert f"<as>{pads['audio'] * 2}<ae><vs>{pads['video']}{pads['audio'] * 4}{pads['video'] * 2}<ve>ok" in text
    # the standalone clip's sound first, then the clip and its sound track, in order of their tokens
    assert [(m, f["n"]) for _, m, f in enc.media] == [("audio", 2), ("video", 3), ("audio", 4)]
    s = enc.input_ids.index(tok.convert_tokens_to_ids("<vs>"))  # text layout before it: index = position
    got = enc.rope_position_ids[0][s : s + 9]  # <vs>, a video token, 4 audio tokens, 2 video tokens, <ve>
    assert got == [s, s + 1, s + 1, s + 2, s + 3, s + 4, s + 2, s + 3, s + 5]
    assert enc.rope_position_ids[1][s : s + 9] == got and enc.rope_position_ids[2][s : s + 9] == got
    assert [row[s + 9] for row in enc.rope_position_ids] == [s + 6] * 3  # "o": the text resumes at the advance


def test_a_laid_out_item_without_rope_writes_the_same_tokens():
    _, with_rope = _encode(Clip())
    _, plain = _encode(Clip(), rope=False)
    assert plain.input_ids == with_rope.input_ids and plain.rope_position_ids is None
    assert [m for _, m, _ in plain.media] == ["audio", "video", "audio"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"counts": (1, 3, 2)}, r"writes 3 audio placeholders for items of 4 tokens"),
        ({"rows": ((0,), (0,), (0,))}, r"gives positions \[1, 1, 1\] for 9 tokens"),
    ],
)
def test_a_wrong_layout_is_a_sample_error(change, message):
    clip = Clip()
    for key, value in change.items():
        setattr(clip, key, value)
    with pytest.raises(SampleError, match=r"a\.jsonl:1: the video processor's layout " + message):
        _encode(clip)


def test_a_layout_needs_an_encoder_for_each_modality_it_writes():
    with pytest.raises(SampleError, match=r"a video item holds audio placeholders, which need a audio encoder in model.encoders"):
        _encode(Clip(), audio=False, parts=[Part("video", "v")])


def test_fixed_rows_place_a_block_and_the_text_after_it():
    rows = mrope_positions(7, [(2, FixedRows(((0, 0, 5), (0, 1, 2), (0, 2, 1)), 9))], RopeLayout())
    assert rows == [[0, 1, 2, 2, 7, 11, 12], [0, 1, 2, 3, 4, 11, 12], [0, 1, 2, 4, 3, 11, 12]]
    with pytest.raises(ValueError, match="fixed block at 5 of 3 tokens does not fit tokens 0..7"):
        mrope_positions(7, [(5, FixedRows(((0, 0, 5), (0, 1, 2), (0, 2, 1)), 9))], RopeLayout())


def _write(path, frames, wave=None, channels=1):
    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(2))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0"
        layout = "mono" if channels == 1 else "stereo"
        sound = container.add_stream("pcm_f32le", rate=8000) if wave is not None else None
        if sound is not None:
            sound.layout = layout
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
        if sound is not None:
            chunk = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(wave).reshape(1, -1), format="flt", layout=layout
            )  # packed: [1, samples * channels]
            chunk.sample_rate, chunk.pts = 8000, 0
            container.mux(sound.encode(chunk))
            container.mux(sound.encode())


def test_load_video_reads_the_sound_track_when_asked(tmp_path):
    pytest.importorskip("av")
    from omnicore.data.media import load_video

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    wave = (rng.standard_normal((8000, 2)) * 0.1).astype(np.float32)
    _write(tmp_path / "a.mkv", frames, wave, channels=2)
    _write(tmp_path / "b.mkv", frames)
    clip = load_video(tmp_path / "a.mkv", audio=True)
    assert clip.audio.sample_rate == 8000 and np.array_equal(clip.audio.samples, wave.mean(axis=1))  # channels averaged
    assert np.array_equal(clip.frames, frames) and clip.fps == 2.0
    assert load_video(tmp_path / "a.mkv").audio is None  # not asked
    assert load_video((tmp_path / "b.mkv").read_bytes(), audio=True).audio is None  # a silent file
