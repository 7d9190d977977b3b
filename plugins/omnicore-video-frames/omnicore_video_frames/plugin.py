"""Hook module of omnicore-video-frames (entry point ``video_frames`` in the group ``omnicore``).

Torch-free on purpose: ``omnicore plugins`` imports every hook module. The encoder's heavy code
(torch, transformers) is imported only when it is built, through the spec's ``target``; its data
side (:mod:`omnicore_video_frames.processor`, no model code) through the spec's ``processor``.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="video_frames",
            target="omnicore_video_frames.encoder:build",
            options_model="omnicore_video_frames.processor:VideoEncoderOptions",
            processor="omnicore_video_frames.processor:build_processor",
            modalities=("video",),
            description="Qwen2-VL vision tower on frames sampled at a set rate (2-frame tubelets, 2x2 merge) + Linear projector to H",
        ),
        ComponentSpec(
            name="video_frames_image",
            target="omnicore_video_frames.encoder:build_image",
            options_model="omnicore_video_frames.processor:VideoEncoderOptions",
            processor="omnicore_video_frames.processor:build_image_processor",
            modalities=("image", "video"),
            description="the video_frames tower on still images (one tubelet each); video may share it (model.encoders.video.share)",
        ),
    ]
