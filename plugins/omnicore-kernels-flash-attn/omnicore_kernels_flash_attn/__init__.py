"""omnicore plugin: varlen FlashAttention kernel (see ``plugin.py`` and ``kernel.py``)."""
