"""omnicore-video-frames: a video encoder for understanding (encoder ``video_frames``).

Importing this package is torch-free; the data side lives in :mod:`omnicore_video_frames.processor`
and the model in :mod:`omnicore_video_frames.encoder`.
"""

__version__ = "0.1.0"
