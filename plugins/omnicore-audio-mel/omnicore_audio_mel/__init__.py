"""omnicore plugin: a log-mel residual-VQ speech tokenizer with a Griffin-Lim vocoder.

Importing this package imports nothing heavy; the tokenizer lives in :mod:`omnicore_audio_mel.tokenizer`,
its fit in :mod:`omnicore_audio_mel.fit`.
"""

__version__ = "0.1.0"
