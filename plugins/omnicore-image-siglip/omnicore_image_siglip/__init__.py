"""omnicore-image-siglip: the SigLIP image encoder for understanding (encoder ``siglip``).

Importing this package is torch-free; the model lives in :mod:`omnicore_image_siglip.encoder`.
"""

__version__ = "0.1.0"
