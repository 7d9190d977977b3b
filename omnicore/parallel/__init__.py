"""Model-level parallel recipes that run inside the model's own modules (expert parallelism).

Submodules import torch; importing this package does not.
"""
