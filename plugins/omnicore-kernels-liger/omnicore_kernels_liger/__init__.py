"""omnicore plugin: Liger kernels (see ``plugin.py`` and ``kernels.py``)."""
