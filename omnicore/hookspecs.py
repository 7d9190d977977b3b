"""Every pluggy hook spec of omnicore, in one module: this is the hook reference.

A plugin is a module (or object) named by an entry point in the group ``omnicore``::

    [project.entry-points.omnicore]
    whisper = "omnicore_audio_whisper.plugin"

whose functions, decorated with :data:`hookimpl` (``from omnicore.api import hookimpl``), answer
some of the hooks below. Every hook is called with no arguments, once per plugin, when the registry
is built, and returns a ``list[ComponentSpec]``: the hook states the kind, so a spec does not (the
registry sets ``ComponentSpec.kind`` from the hook). All results are collected; none "wins".
A hook module must not import torch or other heavy libraries at import time: ``omnicore plugins``
imports every hook module, and must stay fast and torch-free. Put heavy imports in the module named
by each spec's ``target``.

Built-in components are registered through these same hooks by :mod:`omnicore.builtins`.
"""

from __future__ import annotations

import pluggy

from omnicore.components import ComponentSpec

PROJECT = "omnicore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Decorate a plugin's hook functions with this marker (``from omnicore.api import hookimpl``)."""


# ---- Component registration: one hook per kind ----------------------------------------------


@hookspec
def omnicore_encoders() -> list[ComponentSpec]:
    """Register input-side modality encoders (audio, image, video to embeddings).

    Returns:
        The encoder specs. Each ``target`` factory is called as ``factory(options, hidden_size=H)``
        and returns an ``nn.Module`` implementing :class:`omnicore.api.Encoder`; each spec's
        ``processor`` factory is called as ``factory(options)`` and returns its
        :class:`omnicore.api.Processor`.
    """


@hookspec
def omnicore_decoders() -> list[ComponentSpec]:
    """Register output-side modality decoders (embeddings to images, audio).

    Returns:
        The decoder specs. Each ``target`` factory is called as ``factory(options, hidden_size=H)``
        and returns an ``nn.Module`` implementing :class:`omnicore.api.Decoder`; each spec's
        ``processor`` factory is called as ``factory(options)`` and returns its
        :class:`omnicore.api.Processor`.
    """


@hookspec
def omnicore_foundations() -> list[ComponentSpec]:
    """Register foundation models (the language model at the centre).

    Returns:
        The foundation specs. Each ``target`` factory is called as ``factory(options)`` and returns
        an object implementing :class:`omnicore.api.Foundation`.
    """


@hookspec
def omnicore_parallel_strategies() -> list[ComponentSpec]:
    """Register parallel strategies (FSDP2, sequence parallelism, expert parallelism, ...).

    Returns:
        The strategy specs. Each ``target`` factory is called as ``factory(options)`` and returns
        an object implementing :class:`omnicore.api.ParallelStrategy`.
    """


@hookspec
def omnicore_kernels() -> list[ComponentSpec]:
    """Register compute kernels (attention backends, fused losses, norms).

    Returns:
        The kernel specs. Each ``target`` factory is called as ``factory(options)`` and returns an
        object implementing :class:`omnicore.api.Kernel`.
    """


@hookspec
def omnicore_loggers() -> list[ComponentSpec]:
    """Register metrics loggers (TensorBoard, W&B, MLflow, a file), chosen by ``run.loggers``.

    Returns:
        The logger specs. Each ``target`` factory is called as ``factory(options)``, on rank 0
        only, and returns an object implementing :class:`omnicore.api.Logger`.
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
