"""omnicore plugin: the MoVQGAN image decoder (tokenizer for image generation).

Importing this package imports nothing heavy; the model lives in :mod:`omnicore_image_movqgan.decoder`.
"""

__version__ = "0.1.0"
