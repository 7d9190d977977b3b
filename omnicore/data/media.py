"""Loading media named by samples (files, or encoded bytes from a table), with errors that name them.

Images are decoded by Pillow, audio by soundfile (libsndfile), video by PyAV (FFmpeg; the ``av``
package, installed with a video encoder plugin such as omnicore-video-frames). Resampling in time
is the encoder's business (each encoder knows the rate it expects): see :func:`resample` for audio;
a video encoder samples the frames it needs from :class:`Video`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class MediaError(Exception):
    """A media file is missing or cannot be decoded; the message names the file."""


@dataclass
class Audio:
    """Mono audio: ``samples`` float32 ``[num_samples]`` in [-1, 1]; ``sample_rate`` in Hz."""

    samples: np.ndarray
    sample_rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / float(self.sample_rate)


@dataclass
class Video:
    """Decoded video: ``frames`` uint8 ``[T, H, W, 3]`` (RGB), frame ``i`` shown at ``i / fps`` seconds,
    or at ``times[i]`` for a variable-rate clip (sample by time: :meth:`frames_at`); ``fps`` in frames
    per second (FFmpeg's average rate for the stream); ``audio``: the clip's sound track from its
    start (:func:`load_video` with ``audio=True``), None when not read or the file has none.

    ``times``: None for a constant-rate clip; for a variable-rate clip (timestamps more than half a
    frame off the ``i / fps`` grid), each frame's time in seconds from the first frame, from the
    file's timestamps, and ``end``: when the last frame stops being shown."""

    frames: np.ndarray
    fps: float
    audio: Audio | None = None
    times: np.ndarray | None = None
    end: float | None = None

    @property
    def seconds(self) -> float:
        """How long the clip lasts: ``T / fps``, or for a variable-rate clip its ``end``."""
        if self.times is not None and self.end is not None:
            return float(self.end)
        return len(self.frames) / float(self.fps)

    def frames_at(self, seconds: np.ndarray) -> np.ndarray:
        """The index of the frame nearest each time of ``seconds`` (from the clip's start; ties go
        to the earlier frame): ``round(t * fps)`` for a constant-rate clip, by timestamp otherwise."""
        t = np.asarray(seconds, dtype=np.float64)
        if self.times is None:
            return np.clip(np.floor(t * self.fps + 0.5 - 1e-9), 0, len(self.frames) - 1).astype(np.int64)
        return np.abs(self.times[None, :] - t[:, None]).argmin(axis=1).astype(np.int64)


def load_image(source: str | Path | bytes, *, name: str | None = None):
    """Open an image (a file, or its encoded bytes) as a fully decoded RGB ``PIL.Image.Image``, as a
    viewer displays it.

    The EXIF orientation tag is applied (``PIL.ImageOps.exif_transpose``: a phone photo stored
    sideways with orientation 6 comes back upright), for every mode Pillow reads. Then
    :func:`to_rgb` converts the mode: transparency is composited over white, 16- and 32-bit
    grey scales to 8 bits, palette, CMYK and YCbCr through Pillow's conversions.

    Args:
        source: a path, or the bytes of an encoded image (PNG, JPEG, ... as a table column holds them).
        name: where bytes came from (for example ``data.parquet row 12``), for error messages.

    Raises:
        MediaError: if the file is missing, the file or bytes are truncated or corrupt, cannot be
            decoded by Pillow, or declare more pixels than Pillow's decompression-bomb limit
            (``Image.MAX_IMAGE_PIXELS``). The message names the path, or ``name`` for bytes.
    """
    import io
    import warnings

    from PIL import Image, ImageOps

    what = describe_media(source, name)
    if not isinstance(source, (bytes, bytearray)):
        source = Path(source)
        if not source.is_file():
            raise MediaError(f"image file not found: {source}")
    try:
        with warnings.catch_warnings():
            # Pillow only warns between MAX_IMAGE_PIXELS and twice that; both are too large to decode
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source) as img:
                img.load()
                upright = ImageOps.exif_transpose(img)
                return to_rgb(upright)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        limit = Image.MAX_IMAGE_PIXELS
        raise MediaError(f"image {what} is too large to decode ({_one_line(exc)}); the limit is {limit} pixels: resize it") from exc
    except Exception as exc:  # noqa: BLE001 - decoders raise OSError, ValueError, SyntaxError, struct.error... on bad files
        raise MediaError(f"cannot read image {what}: {type(exc).__name__}: {_one_line(exc)}") from exc


def describe_media(source: str | Path | bytes, name: str | None) -> str:
    """A path as itself; bytes as ``(N bytes from NAME)``, so an error says which record held them."""
    if isinstance(source, (bytes, bytearray)):
        return f"({len(source)} bytes from {name})" if name else f"({len(source)} bytes)"
    return str(source)


def to_rgb(img):
    """``img`` as mode ``RGB`` with 8 bits per channel.

    Modes with alpha (``RGBA``, ``LA``, ``PA``, ``P`` with a transparent colour) are composited over
    white, as a viewer on a white page shows them; ``I;16*`` and ``I`` are 16-bit grey (divided by
    257, so 65535 is 255); ``F`` is taken as [0, 1] when its values lie there, else as ``I``; every
    other mode (``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ...) goes through ``Image.convert``.

    Raises:
        ValueError: for a mode Pillow cannot convert to RGB (``LAB``, ``HSV`` with no path).
    """
    from PIL import Image

    if img.mode == "RGB":
        return img.copy()
    if img.mode.startswith("I") or img.mode == "F":
        a = np.asarray(img, dtype=np.float64)
        if not np.isfinite(a).all():
            raise ValueError(f"{int((~np.isfinite(a)).sum())} pixel(s) hold no number (NaN or inf): no viewer can show them")
        scale = 255.0 if img.mode == "F" and a.size and a.min() >= 0 and a.max() <= 1 else 255.0 / 65535.0
        grey = np.clip(np.rint(a * scale), 0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line, without the repr of an in-memory file (``<_io.BytesIO
    object at 0x...>``), which names nothing a user can find."""
    text = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "the bytes", str(exc))
    return " ".join(text.split())


def load_audio(source: str | Path | bytes, *, name: str | None = None) -> Audio:
    """Read audio (a file, or its encoded bytes: WAV, FLAC, OGG, ...) as mono float32 (channels are
    averaged).

    Args:
        source: a path, or the bytes of an encoded audio file (as a table column holds them).
        name: where bytes came from (for example ``data.parquet row 12``), for error messages.

    Raises:
        MediaError: if the file is missing, the file or bytes cannot be decoded by libsndfile, or
            hold no samples. The message names the path, or ``name`` for bytes.
    """
    import io

    import soundfile as sf

    what = describe_media(source, name)
    if not isinstance(source, (bytes, bytearray)):
        source = Path(source)
        if not source.is_file():
            raise MediaError(f"audio file not found: {source}")
    try:
        data, rate = sf.read(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError for bad files
        raise MediaError(f"cannot read audio {what}: {exc}") from exc
    if data.shape[0] == 0:
        raise MediaError(f"audio {what} holds no samples")
    check_finite_audio(data, int(rate), what)
    return Audio(samples=data.mean(axis=1).astype(np.float32), sample_rate=int(rate))


def check_finite_audio(samples: np.ndarray, rate: int, what: str) -> None:
    """Refuse audio ``samples`` (``[N]`` or ``[N, channels]``) holding a NaN or an infinity: no one
    can hear it, and every feature of the clip computed from it would be NaN.

    Raises:
        MediaError: naming ``what``, how many samples and the time of the first.
    """
    bad = ~np.isfinite(samples)
    if bad.any():
        first = int(np.argmax(bad.reshape(len(samples), -1).any(axis=1)))
        raise MediaError(
            f"audio {what} holds {int(bad.sum())} sample(s) that are no number (NaN or inf), the first at {first / rate:.3f} s; "
            "fix or remove the file"
        )


def nonfinite_feature(features: dict[str, Any]) -> str | None:
    """The name of the first floating-point feature (tensor or array) of a processor's ``preprocess``
    output that holds a NaN or an infinity, else None (the data side refuses such an item: it would
    make the step's loss NaN)."""
    for key, value in features.items():
        a = value.detach().cpu().float().numpy() if hasattr(value, "detach") and value.is_floating_point() else value
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and not np.isfinite(a).all():
            return key
    return None


def resample(audio: Audio, target_rate: int) -> Audio:
    """Resample to ``target_rate`` Hz with soxr's high-quality polyphase resampler (libsoxr)."""
    if audio.sample_rate == target_rate:
        return audio
    import soxr

    out = soxr.resample(audio.samples, audio.sample_rate, target_rate, quality="HQ")
    return Audio(samples=np.asarray(out, dtype=np.float32), sample_rate=target_rate)


MAX_VIDEO_BYTES = 1 << 31
"""Decoded size above which :func:`load_video` refuses a video (2 GiB of RGB frames, e.g. about 15
minutes of 320 x 240 at 30 fps): every frame is decoded before an encoder samples it."""


def load_video(source: str | Path | bytes, *, name: str | None = None, audio: bool = False) -> Video:
    """Decode the first video stream of a file (or its encoded bytes: MP4, MKV, WebM, ...) with
    PyAV into RGB frames and the stream's frame rate.

    Every frame is decoded (frames are converted to ``rgb24`` by FFmpeg's swscale); audio streams
    are ignored unless ``audio``. The frame rate is the stream's average rate (``av``'s
    ``average_rate``, else its guessed rate). A variable-rate clip (a frame's timestamp more than
    half a frame from ``i / fps``) keeps each frame's time (``Video.times``, from the timestamps)
    and its end, so that a processor samples it as it is seen (``Video.frames_at``).

    Args:
        source: a path, or the bytes of an encoded video (as a table column holds them).
        name: where bytes came from (for example ``data.parquet row 12``), for error messages.
        audio: also decode the first audio stream, as :func:`load_audio` reads a file (float32,
            its channels averaged to mono, at the stream's own rate) into ``Video.audio``; a file
            without one gives ``None`` there. A video processor asks for it with ``audio_track``
            (see :class:`omnicore.components.Processor`).

    Returns:
        a :class:`Video` with ``frames`` uint8 ``[T, H, W, 3]``, ``fps`` (> 0) and ``audio``.

    Raises:
        MediaError: if PyAV is not installed (install the ``av`` package), the file is missing, the
            file or bytes cannot be decoded, hold no video stream or no frames, have no frame rate,
            or decode to more than :data:`MAX_VIDEO_BYTES`. The message names the path, or
            ``name`` for bytes.
    """
    import io

    what = describe_media(source, name)
    try:
        import av
    except ImportError as exc:
        raise MediaError(f"cannot read video {what}: PyAV is not installed (pip install av, or install omnicore-video-frames)") from exc
    if not isinstance(source, (bytes, bytearray)):
        source = Path(source)
        if not source.is_file():
            raise MediaError(f"video file not found: {source}")
    try:
        with av.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)) as container:
            if not container.streams.video:
                raise MediaError(f"video {what} has no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            frames, times, last = _decode_frames(container, stream, what)
        track = _decode_audio(source, what) if audio else None
    except MediaError:
        raise
    except Exception as exc:  # noqa: BLE001 - PyAV raises av.FFmpegError subclasses, OSError, ValueError on bad files
        raise MediaError(f"cannot read video {what}: {type(exc).__name__}: {_one_line(exc)}") from exc
    if not frames:
        raise MediaError(f"video {what} holds no frames")
    if not rate or float(rate) <= 0:
        raise MediaError(f"video {what} has no frame rate; re-encode it with a constant frame rate (ffmpeg -r)")
    video = Video(frames=np.stack(frames), fps=float(rate), audio=track)
    if times is not None and len(times) > 1:
        t = np.asarray(times, dtype=np.float64) - times[0]
        if np.abs(t - np.arange(len(t)) / video.fps).max() > 0.5 / video.fps:  # not the constant-rate grid: keep the times
            video.times, video.end = t, float(t[-1] + (last if last > 0 else t[-1] - t[-2]))
    return video


def _decode_audio(source: Path | bytes, what: str) -> Audio | None:
    """The first audio stream of a video file as mono float32 (channels averaged, as
    :func:`load_audio`), or None when it has none."""
    import io

    import av

    with av.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp")  # planar float32, the stream's layout and rate
        chunks = [out.to_ndarray() for frame in container.decode(stream) for out in resampler.resample(frame)]
        chunks += [out.to_ndarray() for out in resampler.resample(None)]
        rate = int(stream.rate or 0)
    if not chunks or rate <= 0:
        raise MediaError(f"video {what} has an audio stream without samples or sample rate")
    samples = np.concatenate(chunks, axis=1).mean(axis=0).astype(np.float32)
    check_finite_audio(samples, rate, f"track of video {what}")
    return Audio(samples=samples, sample_rate=rate)


def _decode_frames(container, stream, what: str) -> tuple[list[np.ndarray], list[float] | None, float]:
    """Every frame of ``stream`` as uint8 ``[H, W, 3]`` RGB, refusing more than
    :data:`MAX_VIDEO_BYTES`; with each frame's time in seconds (None when a frame has no timestamp)
    and the last frame's duration in seconds (0 when unknown)."""
    frames: list[np.ndarray] = []
    times: list[float] | None = []
    last = 0.0
    total = 0
    for frame in container.decode(stream):
        if frame.time is None:
            times = None
        elif times is not None:
            times.append(float(frame.time))
        last = float(frame.duration * frame.time_base) if frame.duration and frame.time_base else 0.0
        rgb = frame.to_ndarray(format="rgb24")
        if frames and rgb.shape != frames[0].shape:
            raise MediaError(f"video {what} changes frame size ({frames[0].shape[:2]} to {rgb.shape[:2]}); re-encode it at one size")
        total += rgb.nbytes
        if total > MAX_VIDEO_BYTES:
            raise MediaError(f"video {what} decodes to more than {MAX_VIDEO_BYTES} bytes of frames; cut or downscale it")
        frames.append(rgb)
    return frames, times, last
