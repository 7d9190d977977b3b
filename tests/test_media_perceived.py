"""Media as a person perceives it: audio holding a NaN sample is a bad sample (``FILE:LINE``, skipped
and counted under ``data.on_error: skip``, a clear error otherwise), not a NaN training step; a
processor output that is no number is refused the same way; and a variable-frame-rate clip is
sampled by its timestamps (the frames seen nearest each second), not by index at its average rate."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import tiny_config_dict

from omnicore.config import Config
from omnicore.data.jsonl import SampleError, read_jsonl
from omnicore.data.media import MediaError, Video, load_audio, load_video

# ---- non-finite audio ----------------------------------------------------------------------------


@pytest.fixture
def audio_data(tmp_path) -> Path:
    """Eight 0.3 s noise clips and one with a NaN at 0.1 s (line 5 of ``train.jsonl``), each asked
    for its number."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(9):
        clip = (0.1 * rng.standard_normal(4800)).astype(np.float32)
        if i == 4:
            clip[1600] = np.nan
        sf.write(tmp_path / f"a{i}.wav", clip, 16000, subtype="FLOAT")  # float WAV: a NaN is stored as is
        user = [{"type": "audio", "path": f"a{i}.wav"}, {"type": "text", "text": "Which number?"}]
        lines.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": str(i)}]})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def test_load_audio_refuses_a_nan_sample_naming_the_file_and_time(audio_data):
    with pytest.raises(MediaError, match=r"a4\.wav holds 1 sample\(s\) that are no number \(NaN or inf\), the first at 0\.100 s"):
        load_audio(audio_data / "a4.wav")
    assert np.isfinite(load_audio(audio_data / "a3.wav").samples).all()


def _cfg(data: Path, on_error: str) -> Config:
    d = tiny_config_dict(str(data / "train.jsonl"), decoders=False, output_dir=str(data / f"run-{on_error}"), max_steps=3)
    d["model"]["encoders"] = {"audio": d["model"]["encoders"]["audio"]}
    d["data"].update(on_error=on_error, max_tokens=256)
    return Config.model_validate(d)


def test_a_nan_clip_is_a_bad_sample_at_its_line(audio_data):
    from omnicore.data.chat import ChatProcessor
    from omnicore.model.build import build_omni_model

    cfg = _cfg(audio_data, "raise")
    model, tokenizer = build_omni_model(cfg)
    proc = ChatProcessor.for_model(tokenizer, model, cfg.data)
    samples = list(read_jsonl(audio_data / "train.jsonl"))
    proc.encode(samples[3])
    with pytest.raises(SampleError, match=rf"^{audio_data / 'train.jsonl'}:5: audio {audio_data / 'a4.wav'} holds 1 sample"):
        proc.encode(samples[4])


@pytest.mark.slow
def test_training_skips_and_counts_the_nan_clip_or_stops_naming_it(audio_data):
    """data.on_error: skip trains on (finite losses, no non-finite step) and counts the clip under
    ``skipped/<source>``; raise stops with ``FILE:LINE`` and the file, before any step."""
    from omnicore.train.loop import train

    history = train(_cfg(audio_data, "skip"))
    assert [r["step"] for r in history] == [1, 2, 3] and all(np.isfinite(r["loss"]) for r in history)
    assert history[-1]["skipped/train"] >= 1 and not any(r["skipped"] for r in history)
    with pytest.raises(SampleError, match=rf"train\.jsonl:5: audio {audio_data / 'a4.wav'} holds 1 sample\(s\) that are no number"):
        train(_cfg(audio_data, "raise"))


def test_a_processor_output_that_is_no_number_is_refused(audio_data):
    """Siblings of the NaN clip: finite media whose features come out non-finite are a bad sample too."""
    from omnicore.data.chat import ChatProcessor
    from omnicore.model.build import build_omni_model

    cfg = _cfg(audio_data, "raise")
    model, tokenizer = build_omni_model(cfg)
    proc = ChatProcessor.for_model(tokenizer, model, cfg.data)
    inner = proc.encoders["audio"]

    class Broken:
        modality = "audio"

        def preprocess(self, media):
            feats = dict(inner.preprocess(media))
            feats["input_features"] = feats["input_features"] * float("inf")
            return feats

        def __getattr__(self, name):
            return getattr(inner, name)

    proc.encoders["audio"] = Broken()
    with pytest.raises(
        SampleError, match=r"train\.jsonl:1: the audio encoder's processor gave feature 'input_features' of .*a0\.wav a NaN or inf"
    ):
        proc.encode(next(iter(read_jsonl(audio_data / "train.jsonl"))))


def test_an_image_of_nan_pixels_is_refused(tmp_path):
    from PIL import Image

    from omnicore.data.media import load_image

    a = np.full((4, 4), 0.5, np.float32)
    a[1, 2] = np.nan
    Image.fromarray(a, "F").save(tmp_path / "f.tiff")
    with pytest.raises(MediaError, match=r"f\.tiff: ValueError: 1 pixel\(s\) hold no number"):
        load_image(tmp_path / "f.tiff")


# ---- variable frame rate -------------------------------------------------------------------------

TIMES = [0.1 * i for i in range(8)] + [1.7, 2.7, 3.7, 4.7]
"""A variable-rate clip: 8 frames in its first 0.7 s, then one a second up to 4.7 s."""


def write_vfr_clip(path: Path) -> None:
    """:data:`TIMES` as an MPEG-4 clip (time base 1/10 s), frame ``i`` all grey level ``20 i``."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 10)
        for i, t in enumerate(TIMES):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 20 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = round(t * 10), Fraction(1, 10)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def test_a_variable_rate_clip_is_sampled_by_timestamp(tmp_path):
    """At 1 fps the frames kept are those seen nearest 0, 1, 2 and 3 s ([0, 7, 8, 9]: 0.0, 0.7,
    1.7 and 2.7 s), 1 s apart as reported; by index at the average rate (2.5 fps) they were
    [0, 2, 5, 7], all inside the first 0.7 s."""
    from omnicore_video_frames.processor import VideoFramesProcessor, sample_indices

    write_vfr_clip(tmp_path / "vfr.mp4")
    clip = load_video(tmp_path / "vfr.mp4")
    assert [int(round(f.mean() / 20)) for f in clip.frames] == list(range(12))  # each frame known by its grey level
    np.testing.assert_allclose(clip.times, TIMES, atol=1e-6)
    assert clip.fps == pytest.approx(2.5) and clip.seconds == pytest.approx(4.8)
    assert sample_indices(len(clip.frames), clip.fps, 1.0, 16)[0].tolist() == [0, 2, 5, 7]  # by index: what it did
    proc = VideoFramesProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, fps=1.0, max_frames=16)
    idx, step = proc.sample(clip)
    nearest = [int(np.argmin(np.abs(np.asarray(TIMES) - k))) for k in range(4)]
    assert idx.tolist() == nearest == [0, 7, 8, 9] and step == 1.0
    feats = proc.preprocess(clip)
    assert feats["video_grid_thw"].tolist() == [2, 8, 8] and float(feats["second_per_grid_ts"]) == 2.0
    # the features are those of the frames seen at 0, 1, 2 and 3 s, shown at a constant 1 fps
    seen = proc.preprocess(Video(frames=clip.frames[[0, 7, 8, 9]], fps=1.0))
    assert np.array_equal(feats["pixel_values_videos"].numpy(), seen["pixel_values_videos"].numpy())


def test_a_constant_rate_clip_keeps_its_index_sampling():
    """No timestamps kept (``times`` None): frame ``floor(k * r / f)``, as before."""
    from omnicore_video_frames.processor import VideoFramesProcessor

    clip = Video(frames=np.zeros((30, 8, 8, 3), np.uint8), fps=10.0)
    proc = VideoFramesProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, fps=4.0, max_frames=16)
    assert clip.times is None and proc.sample(clip)[0].tolist() == [0, 2, 5, 7, 10, 12, 15, 17, 20, 22, 25, 27]
