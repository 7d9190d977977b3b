"""Pieces of the CPU benchmark suite run by ``bench/run.py`` (issue #5).

* :mod:`suite.data`: the variable-length text samples (repository text cut to log-normal lengths)
  and the digits samples' real token lengths.
* :mod:`suite.waste`: padding-waste arithmetic (pad to longest vs packing), pure Python.
* :mod:`suite.overhead`: omnicore's training step vs a hand-written PyTorch + transformers loop.
* :mod:`suite.hf_trainer`: omnicore's packed training vs the Hugging Face ``Trainer``.
* :mod:`suite.startup`: ``omnicore plugins`` start-up vs ``python -c pass`` (reuses
  ``bench/plugins_startup.py``).
"""
