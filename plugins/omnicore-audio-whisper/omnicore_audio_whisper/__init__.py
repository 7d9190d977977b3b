"""omnicore-audio-whisper: the ``encoder/whisper`` component for omnicore.

Importing this package is torch-free; the model lives in :mod:`omnicore_audio_whisper.encoder`,
which the registry imports only when the encoder is built.
"""

__version__ = "0.1.0"
