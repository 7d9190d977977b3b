"""Every pluggy hook spec of omnicore, in one module: this is the hook reference.

A plugin is a module (or object) named by an entry point in the group ``omnicore``::

    [project.entry-points.omnicore]
    whisper = "omnicore_audio_whisper.plugin"

whose functions, decorated with :data:`hookimpl`, answer some of the hooks below. Every hook is
called with no arguments, once per plugin, and returns a list of
:class:`omnicore.components.ComponentSpec` of its kind (all results are collected; none "wins").
A hook module must not import torch or other heavy libraries at import time: ``omnicore plugins``
imports every hook module, and must stay fast and torch-free. Put heavy imports in the module named
by each spec's ``target``.

Built-in components are registered through these same hooks by :mod:`omnicore.builtins`.
"""

from __future__ import annotations

import pluggy

PROJECT = "omnicore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Decorate a plugin's hook functions with this marker (``from omnicore import hookimpl``)."""


# ---- Component registration: one hook per kind ----------------------------------------------


@hookspec
def omnicore_encoders() -> list:
    """Register input-side modality encoders.

    Called once per plugin when the registry is built. Returns a list of ``ComponentSpec`` with
    ``kind="encoder"``; each ``target`` factory is called as ``factory(options, hidden_size=H)`` and
    returns an ``nn.Module`` implementing :class:`omnicore.components.Encoder`.
    """


@hookspec
def omnicore_decoders() -> list:
    """Register output-side modality decoders.

    Returns a list of ``ComponentSpec`` with ``kind="decoder"``; each ``target`` factory is called
    as ``factory(options, hidden_size=H)`` and returns an ``nn.Module`` implementing
    :class:`omnicore.components.Decoder`.
    """


@hookspec
def omnicore_foundations() -> list:
    """Register foundation models (the language model at the centre).

    Returns a list of ``ComponentSpec`` with ``kind="foundation"``; each ``target`` factory is
    called as ``factory(options)`` and returns a :class:`omnicore.components.Foundation`.
    """


@hookspec
def omnicore_parallel_strategies() -> list:
    """Register parallel strategies (FSDP2, sequence parallelism, ...).

    Returns a list of ``ComponentSpec`` with ``kind="parallel"``; each ``target`` factory is called
    as ``factory(options)`` and returns a :class:`omnicore.components.ParallelStrategy`.
    """


@hookspec
def omnicore_kernels() -> list:
    """Register compute kernels (attention backends, fused losses, norms).

    Returns a list of ``ComponentSpec`` with ``kind="kernel"``; each ``target`` factory is called as
    ``factory(options)`` and returns a :class:`omnicore.components.Kernel`.
    """


@hookspec
def omnicore_loggers() -> list:
    """Register metrics loggers (TensorBoard, W&B, MLflow, a file), chosen by ``run.loggers``.

    Returns a list of ``ComponentSpec`` with ``kind="logger"``; each ``target`` factory is called
    as ``factory(options)`` on rank 0 only and returns a :class:`omnicore.components.Logger`.
    Core API 1.3.
    """


HOOK_FOR_KIND: dict[str, str] = {
    "encoder": "omnicore_encoders",
    "decoder": "omnicore_decoders",
    "foundation": "omnicore_foundations",
    "parallel": "omnicore_parallel_strategies",
    "kernel": "omnicore_kernels",
    "logger": "omnicore_loggers",
}
"""Which registration hook registers which kind."""
