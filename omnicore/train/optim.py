"""The optimizer, the learning-rate schedule and gradient clipping of the training recipe.

* :func:`build_optimizer`: AdamW, weight decay on matrices only, param groups per ``train.lr_multipliers`` factor.
* :func:`warmup_cosine`: linear warm-up, then cosine decay to a floor (a ``LambdaLR`` multiplier;
  also the schedule of plugins' own fits, through :mod:`omnicore.api`); :func:`build_schedule`
  makes the run's, at step 0 or at a resumed step.
* :func:`clip_grad_norm_`: global-norm clipping that works across DTensor meshes (expert parallelism).
* :class:`NonFiniteError` and :func:`nonfinite_message`: a step whose loss or gradient norm is NaN or
  inf (``train.on_nonfinite``, see :func:`omnicore.train.loop.apply_update`); :func:`nonfinite_tensors`
  and :func:`nonfinite_save_message`: weights that became NaN or inf at a finite loss, refused at
  save time (:func:`omnicore.train.loop.save`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from omnicore.config import Config, ConfigError
from omnicore.model.trainable import lr_factors


def build_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization") over the trainable
    parameters of ``model``, with ``train.betas``; weight decay (``train.weight_decay``) only on
    matrices (>= 2-D), not on biases and norm gains, as in GPT-2/nanoGPT (karpathy/nanoGPT
    ``model.py``, ``configure_optimizers``).

    One param group per (weight decay yes/no) x (``train.lr_multipliers`` factor), in the order the
    parameters first appear, with ``lr = train.lr * factor`` and a ``factor`` key; the ``LambdaLR``
    schedule multiplies each group's own base lr, so a factor holds at every step. Frozen parameters
    (``requires_grad`` False, see :func:`omnicore.model.trainable.apply_freeze`) are in no group and
    get no optimizer state.

    Raises:
        ConfigError: a ``train.lr_multipliers`` prefix matches no parameter, or nothing is trainable.
    """
    factors = lr_factors(model, cfg.train.lr_multipliers)
    groups: dict[tuple[float, bool], dict[str, Any]] = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        factor, decay = factors[id(p)], p.ndim >= 2
        group = groups.setdefault(
            (factor, decay),
            {"params": [], "lr": cfg.train.lr * factor, "factor": factor, "weight_decay": cfg.train.weight_decay if decay else 0.0},
        )
        group["params"].append(p)
    if not groups:
        raise ConfigError("no trainable parameters: every parameter is frozen (train.freeze, model.lora); leave some part to train")
    impl = {"fused": True} if _fused([p for g in groups.values() for p in g["params"]]) else {"foreach": False}
    return torch.optim.AdamW(list(groups.values()), lr=cfg.train.lr, betas=cfg.train.betas, **impl)


def use_implementation(optimizer: torch.optim.Optimizer) -> None:
    """Set each param group's ``fused`` / ``foreach`` as :func:`_fused` chooses for its
    parameters now. A loaded state dict brings back the saved run's choice (``Optimizer.load_state_dict``
    keeps the saved groups' settings), which may be another world size's or an older omnicore's, so
    the training loop calls this after loading a checkpoint. Where fused turns on, each parameter's
    ``step`` moves to float32 on the parameter's device, as the fused kernel needs."""
    for group in optimizer.param_groups:
        fused = _fused(group["params"])
        group["fused"], group["foreach"] = fused, None if fused else False
        if fused:
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                if torch.is_tensor(st.get("step")):
                    st["step"] = st["step"].to(device=p.device, dtype=torch.float32)


def _fused(params: list[torch.Tensor]) -> bool:
    """Whether AdamW runs PyTorch's fused kernel (``fused=True``: one kernel over all tensors): when
    every parameter is a plain floating-point tensor on the CPU or a CUDA device; otherwise (DTensor
    shards of FSDP2/HSDP/EP, other devices) the per-tensor loop (``foreach=False``), the one every
    parameter layout supports. Fused is the fastest of the three where it applies (the step times
    of each are in ``bench/README.md``)."""
    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    return all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.device.type in ("cpu", "cuda") and p.dtype in floats for p in params)


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier for ``torch.optim.lr_scheduler.LambdaLR``: linear from 0 to 1 over ``warmup``
    steps, then cosine down to ``min_ratio`` at ``total`` (Loshchilov & Hutter 2017, SGDR, without
    restarts); it stays at ``min_ratio`` after ``total``.

    With ``warmup=0`` it is plain cosine decay: ``min_ratio + (1 - min_ratio) * 0.5 * (1 +
    cos(pi * step / total))``.
    """

    def fn(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def build_schedule(optimizer: torch.optim.Optimizer, cfg: Config, step: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of ``train``'s settings (:func:`warmup_cosine` of ``warmup_steps``,
    ``max_steps`` and ``min_lr_ratio``) at ``step`` steps done: each param group's base lr is
    ``train.lr`` times its ``factor`` and its lr the schedule's at ``step``. A resumed run calls it
    after loading the optimizer's state, so that a changed ``train.lr`` or schedule applies from the
    checkpoint's step (:mod:`omnicore.checkpoint.changes`); with the settings unchanged the lr is
    the one the checkpoint's schedule gives, bit for bit."""
    t = cfg.train
    for group in optimizer.param_groups:
        group["initial_lr"] = t.lr * group.get("factor", 1.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(t.warmup_steps, t.max_steps, t.min_lr_ratio), last_epoch=step - 1)


def clip_grad_norm_(parameters: Any, max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``parameters`` in place to a global L2 norm of ``max_norm``; returns the
    norm before clipping (a plain scalar tensor, the same on every rank).

    Gradients may be DTensors on *different* meshes: with expert parallelism the experts live on
    ``(dp_shard_sp, ep)`` and the dense weights on ``fsdp``, and
    ``torch.nn.utils.clip_grad_norm_`` refuses to stack their norms. So the norm is taken per mesh
    (each DTensor norm made whole with ``full_tensor()``), combined as ``sqrt(sum of squares)``, and
    each group is scaled by the same coefficient (torchtitan clips EP models the same way:
    ``torchtitan/distributed/utils.py``, ``_clip_grad_norm_with_ep``).
    """
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    total_sq = torch.zeros((), dtype=torch.float32)
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total_sq = total_sq + norm.float().cpu() ** 2
    total = total_sq.sqrt()
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total.to(group[0].grad.device))
    return total


class NonFiniteError(ValueError):
    """A training step's loss (summed over ranks) or global gradient norm is NaN or inf, under
    ``train.on_nonfinite: stop`` or after ``train.max_skipped_steps`` skipped steps in a row. Raised
    before the optimizer step on every rank alike, so the model still holds the weights of the last
    finite step and nothing of the bad step is saved or exported. Also raised by a save that finds
    NaN or inf in the weights or optimizer state (an update at a finite loss made them so): nothing
    non-finite is ever written. The CLI reports it as one ``error:`` line (exit 2)."""


def nonfinite_message(cfg: Config, step: int, loss: float, grad_norm: float, in_row: int, bad_weights: str | None = None) -> str:
    """The message of :class:`NonFiniteError` for 1-based ``step``: the values, what the weights are
    now, and what to try, with the run's own settings (``in_row``: non-finite steps in a row,
    this one included; ``bad_weights``: :func:`describe_nonfinite` of the tensors that already hold
    NaN or inf, when an earlier update made them so at a finite loss; None when the weights are finite)."""
    what = f"non-finite training step {step}: loss {loss:.6g}, gradient norm {grad_norm:.6g}"
    if in_row > 1:
        what += f" ({in_row} non-finite steps in a row; train.max_skipped_steps is {cfg.train.max_skipped_steps})"
    if bad_weights:
        return (
            f"{what}; the weights themselves already hold NaN or inf ({bad_weights}): an earlier update made them so at a "
            "finite loss, and no checkpoint or export holds them (a save refuses non-finite weights). "
            f"Try {', '.join(_tries(cfg))}; then start again or --resume from the last checkpoint"
        )
    return (
        f"{what}; stopped before the optimizer step, so the weights are those of the last finite step and nothing was saved "
        f"or exported for this step. Try {', '.join(_tries(cfg))}; or check the data of this step"
    )


def nonfinite_save_message(cfg: Config, step: int, bad: list[str], latest: str | None) -> str:
    """The message of :class:`NonFiniteError` when the checkpoint of 1-based ``step`` is refused
    because tensors of the model or the optimizer hold NaN or inf (``bad``: this rank's, from
    :func:`nonfinite_tensors`; empty when only another rank has them); ``latest``: the checkpoint
    left as it was, if any."""
    which = describe_nonfinite(bad)
    kept = f"the last checkpoint, {latest}, is left as it was" if latest else "no checkpoint was written"
    return (
        f"step {step}: not saved: the weights or optimizer state hold NaN or inf ({which}), although every step's loss and "
        f"gradient norm were finite: an update made them non-finite; {kept}. Try {', '.join(_tries(cfg))}"
    )


def describe_nonfinite(bad: list[str]) -> str:
    """``3 tensor(s), the first lm.lm_head.weight`` for this rank's :func:`nonfinite_tensors`;
    ``on another rank`` when this rank has none."""
    return f"{len(bad)} tensor(s), the first {bad[0]}" if bad else "on another rank"


def _tries(cfg: Config) -> list[str]:
    """What to try after a non-finite step, with the run's own settings."""
    t = cfg.train
    tries = [f"a lower train.lr (now {t.lr:g})"]
    tries.append("train.grad_clip 1.0" if t.grad_clip == 0 else f"a lower train.grad_clip (now {t.grad_clip:g})")
    tries.append(f"a longer train.warmup_steps (now {t.warmup_steps})")
    if cfg.run.dtype == "bfloat16":
        tries.append("run.dtype float32 with train.mixed_precision bf16 (fp32 weights and optimizer state)")
    if t.on_nonfinite == "stop":
        tries.append("train.on_nonfinite skip, to skip rare bad steps")
    return tries


def nonfinite_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> list[str]:
    """The names of this rank's floating-point parameters and buffers of ``model`` (their local
    shards, for DTensors) and, with ``optimizer``, of its state tensors (``<param>: exp_avg``) that
    hold a NaN or inf; empty when every one is finite. One device synchronisation per device.
    What a checkpoint or export would write, checked before it is written (the loss and gradient
    norm are finite at an update that makes the weights non-finite, e.g. an extreme ``train.lr``)."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = [(n, t) for n, t in list(model.named_parameters()) + list(model.named_buffers())]
    if optimizer is not None:
        for p, st in optimizer.state.items():
            tensors += [(f"{names.get(id(p), 'a parameter')}: {k}", v) for k, v in st.items() if torch.is_tensor(v)]
    local = [(n, t.to_local() if hasattr(t, "to_local") else t) for n, t in tensors]
    local = [(n, t) for n, t in local if t.is_floating_point() and t.numel() and not t.is_meta]
    if not local:
        return []
    flags = [torch.isfinite(t).all() for _, t in local]
    finite = [True] * len(flags)
    by_device: dict[torch.device, list[int]] = {}
    for i, f in enumerate(flags):
        by_device.setdefault(f.device, []).append(i)
    for idx in by_device.values():
        for i, ok in zip(idx, torch.stack([flags[i] for i in idx]).cpu().tolist()):
            finite[i] = ok
    return [n for (n, _), ok in zip(local, finite) if not ok]
