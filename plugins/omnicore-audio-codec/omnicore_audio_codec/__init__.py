"""omnicore plugin: the EnCodec audio decoder (speech as discrete codes, for generation).

Importing this package imports nothing heavy; the model lives in :mod:`omnicore_audio_codec.decoder`.
"""

__version__ = "0.1.0"
