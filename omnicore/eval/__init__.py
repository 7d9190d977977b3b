"""Evaluation: held-out loss, answer scoring, generation and sample grids.

The modules, in reading order (each name is imported from its own module):

- :mod:`omnicore.eval.heldout`: the held-out loss of ``data.eval``, overall, per part and per task
  (:func:`~omnicore.eval.heldout.heldout_loss`), on one process or all ranks of a run.
- :mod:`omnicore.eval.loading`: a trained model from an export or a checkpoint, on ``run.device``.
- :mod:`omnicore.eval.generate`: answers to prompts with the ``generate`` section's sampling;
  ``omnicore generate``.
- :mod:`omnicore.eval.scoring`: exact-match scoring of generated answers; ``omnicore eval``.
- :mod:`omnicore.eval.validate`: :class:`~omnicore.eval.validate.Validator`, the validation of a
  training run.
- :mod:`omnicore.eval.samples`: :class:`~omnicore.eval.samples.Sampler`, the sample grids of a
  training run.

The training loop (:mod:`omnicore.train.loop`) builds a ``Validator`` and a ``Sampler`` before step
1 and asks each ``due(step)`` after every step, then ``run(model, step)``. Nothing here imports
:mod:`omnicore.train`: the dependency goes one way (``scripts/check_imports.py`` checks it).
"""
