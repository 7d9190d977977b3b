"""The public API for plugin authors: the one module a plugin imports from omnicore.

Everything a plugin needs is here: the hook marker, ``ComponentSpec``, every contract Protocol and
every helper. A plugin's tests may also use the testing kit :mod:`omnicore.testing`. Every other
module of omnicore is internal and may change between releases; ``tests/test_public_api.py`` fails
when a first-party plugin, contrib package or the template imports one.

Importing this module is cheap and torch-free: each name is imported from its home module on first
use (PEP 562 module ``__getattr__``), so a hook module may import it too. Type checkers read the
``TYPE_CHECKING`` block below (and the package's ``py.typed``), so they see each name's real type.

What is here, by topic:

* **Registration**: :data:`hookimpl`, :class:`ComponentSpec`, :data:`KINDS`,
  :data:`CORE_API_VERSION`; :class:`Registry` (``Registry.discover().build(kind, name, options)``
  builds any installed component, as a run does) and :class:`RegistryError`.
* **Contracts**: :class:`Processor`, :class:`Encoder` (with :class:`EncoderOutput`, rows for
  the foundation's intermediate layers), :class:`Decoder`, :class:`Foundation` (with
  :class:`FoundationOptional`),
  :class:`ParallelModel` (with :class:`EncoderCall`, what its encoder hooks get),
  :class:`ParallelStrategy` (with :class:`ParallelStrategyOptional`,
  :class:`SequenceParallel`, :class:`ParallelStateView`), :class:`Kernel` (with
  :class:`CrossEntropyKernel`), :class:`Logger`.
* **Decoders**: :class:`CodebookDecoder` (the base of a decoder over a discrete tokenizer: the LM
  adapter, freezing, saving; several codebooks per frame with a depth decoder of
  :class:`DepthOptions`).
* **Data**: :data:`IGNORE_INDEX` (the label of positions that are not trained), :class:`Audio`,
  :func:`load_audio`, :func:`load_image`, :func:`resample`, :class:`Video`, :func:`load_video`,
  :class:`MediaError` (what a processor raises on media it cannot read), :class:`ItemLayout` (an
  item a processor writes itself: interleaved placeholders of several encoders, its own positions),
  :class:`RopeLayout` (what a foundation with 3-D rotary positions declares:
  ``FoundationOptional.rope_layout``).
* **Audio targets**: :func:`target_waveform` (a decoder's target clip resampled and padded to a
  fixed length) and :func:`collate_waveforms` (waveforms padded to the longest).
* **Randomness**: :func:`item_generators` (one generator per item of a training batch, seeded from
  the item's sample: an encoder's augmentation draws from it), :data:`ITEM_SEEDS` (where a batch
  holds them) and :func:`collate_items` (a processor's collate that keeps them, for a strategy
  that moves items between ranks).
* **Varlen (packed samples)**: :func:`cu_seqlens_from_position_ids`, :func:`plan_varlen`,
  :func:`mark_varlen`, :func:`is_varlen`, :data:`CU_SEQLENS_KWARGS`, :func:`varlen_from_kwargs`.
* **Kernels**: :func:`cuda_and_package` (the build-time check of a GPU kernel), :func:`plain_weight`
  (a DTensor weight as a plain tensor), :class:`TorchCrossEntropy` (the reference text loss),
  :func:`rms_norm_modules` (the foundation's RMSNorm modules).
* **Parallel strategies**: :class:`Violation`, :class:`StrategyPlan`, :data:`PHASES`,
  :data:`DEFAULT_PHASE`, :class:`FSDP2` and :class:`NoParallel` (to compose rather than copy),
  :class:`BlockStrategy` (base of per-block strategies), :func:`checkpoint_module`.
* **Expert parallelism**: :class:`ExpertParallel`, :class:`EPContext`, :func:`all_to_all`,
  :func:`regroup`, :func:`local_experts_forward`.
* **Foundations and weights**: :func:`byte_tokenizer`, :func:`load_hf_pretrained`,
  :func:`save_extra_weights`, :func:`load_extra_weights`, :func:`build_mrope_lm` (an mRoPE text
  model under its LM head); sharded loading of a component's part of a checkpoint:
  :func:`on_meta`, :func:`plan_checkpoint` (its key ``renames`` and ``other_parts``), :func:`embedding_names` (its
  ``grow`` for a language model), :func:`fill_now` (fill such a plan at once, for a component used alone) and :class:`LoadError`.
* **Training**: :func:`warmup_cosine` (the LR schedule of the training loop, for a plugin's own
  fits).
* **FLOPs**: :func:`model_flops` (a model's :class:`ModelFlops`: each part's FLOPs per
  micro-batch, and one encoder item's, :meth:`ModelFlops.item_flops`: the cost a strategy that
  balances encoder work weighs items by), :func:`input_units` (the size measured FLOPs scale with),
  :func:`flop_counter` (torch's ``FlopCounterMode`` with the ops it leaves out).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see: the same names, imported from their homes (``X as X`` re-exports)
    from omnicore import CORE_API_VERSION as CORE_API_VERSION
    from omnicore.components import DEFAULT_PHASE as DEFAULT_PHASE
    from omnicore.components import KINDS as KINDS
    from omnicore.components import PHASES as PHASES
    from omnicore.components import ComponentSpec as ComponentSpec
    from omnicore.components import CrossEntropyKernel as CrossEntropyKernel
    from omnicore.components import Decoder as Decoder
    from omnicore.components import Encoder as Encoder
    from omnicore.components import EncoderCall as EncoderCall
    from omnicore.components import EncoderOutput as EncoderOutput
    from omnicore.components import Foundation as Foundation
    from omnicore.components import FoundationOptional as FoundationOptional
    from omnicore.components import Kernel as Kernel
    from omnicore.components import Logger as Logger
    from omnicore.components import ParallelModel as ParallelModel
    from omnicore.components import ParallelStateView as ParallelStateView
    from omnicore.components import ParallelStrategy as ParallelStrategy
    from omnicore.components import ParallelStrategyOptional as ParallelStrategyOptional
    from omnicore.components import Processor as Processor
    from omnicore.components import SequenceParallel as SequenceParallel
    from omnicore.components import StrategyPlan as StrategyPlan
    from omnicore.components import Violation as Violation
    from omnicore.data.chat import IGNORE_INDEX as IGNORE_INDEX
    from omnicore.data.chat import ItemLayout as ItemLayout
    from omnicore.data.media import Audio as Audio
    from omnicore.data.media import MediaError as MediaError
    from omnicore.data.media import Video as Video
    from omnicore.data.media import load_audio as load_audio
    from omnicore.data.media import load_image as load_image
    from omnicore.data.media import load_video as load_video
    from omnicore.data.media import resample as resample
    from omnicore.data.positions import RopeLayout as RopeLayout
    from omnicore.data.seeds import ITEM_SEEDS as ITEM_SEEDS
    from omnicore.data.seeds import collate_items as collate_items
    from omnicore.data.seeds import item_generators as item_generators
    from omnicore.data.waveforms import collate_waveforms as collate_waveforms
    from omnicore.data.waveforms import target_waveform as target_waveform
    from omnicore.hookspecs import hookimpl as hookimpl
    from omnicore.kernels.common import cuda_and_package as cuda_and_package
    from omnicore.kernels.common import plain_weight as plain_weight
    from omnicore.kernels.cross_entropy import TorchCrossEntropy as TorchCrossEntropy
    from omnicore.kernels.rmsnorm import rms_norm_modules as rms_norm_modules
    from omnicore.kernels.varlen import CU_SEQLENS_KWARGS as CU_SEQLENS_KWARGS
    from omnicore.kernels.varlen import cu_seqlens_from_position_ids as cu_seqlens_from_position_ids
    from omnicore.kernels.varlen import is_varlen as is_varlen
    from omnicore.kernels.varlen import mark_varlen as mark_varlen
    from omnicore.kernels.varlen import plan_varlen as plan_varlen
    from omnicore.kernels.varlen import varlen_from_kwargs as varlen_from_kwargs
    from omnicore.model.codebook import CodebookDecoder as CodebookDecoder
    from omnicore.model.codebook import DepthOptions as DepthOptions
    from omnicore.model.flops import ModelFlops as ModelFlops
    from omnicore.model.flops import flop_counter as flop_counter
    from omnicore.model.flops import input_units as input_units
    from omnicore.model.flops import model_flops as model_flops
    from omnicore.model.foundation import byte_tokenizer as byte_tokenizer
    from omnicore.model.loading import LoadError as LoadError
    from omnicore.model.loading import embedding_names as embedding_names
    from omnicore.model.loading import fill_now as fill_now
    from omnicore.model.loading import on_meta as on_meta
    from omnicore.model.loading import plan_checkpoint as plan_checkpoint
    from omnicore.model.mrope import build_mrope_lm as build_mrope_lm
    from omnicore.model.weights import load_extra_weights as load_extra_weights
    from omnicore.model.weights import load_hf_pretrained as load_hf_pretrained
    from omnicore.model.weights import save_extra_weights as save_extra_weights
    from omnicore.parallel.block import BlockStrategy as BlockStrategy
    from omnicore.parallel.checkpointing import checkpoint_module as checkpoint_module
    from omnicore.parallel.expert import EPContext as EPContext
    from omnicore.parallel.expert import ExpertParallel as ExpertParallel
    from omnicore.parallel.expert import all_to_all as all_to_all
    from omnicore.parallel.expert import local_experts_forward as local_experts_forward
    from omnicore.parallel.expert import regroup as regroup
    from omnicore.parallel.fsdp import FSDP2 as FSDP2
    from omnicore.parallel.fsdp import NoParallel as NoParallel
    from omnicore.registry import Registry as Registry
    from omnicore.registry import RegistryError as RegistryError
    from omnicore.train.optim import warmup_cosine as warmup_cosine

_EXPORTS: dict[str, str] = {
    # registration
    "hookimpl": "omnicore.hookspecs",
    "ComponentSpec": "omnicore.components",
    "KINDS": "omnicore.components",
    "CORE_API_VERSION": "omnicore",
    # contracts: one Protocol per kind, and their parts
    "Processor": "omnicore.components",
    "Encoder": "omnicore.components",
    "EncoderOutput": "omnicore.components",
    "Decoder": "omnicore.components",
    "Foundation": "omnicore.components",
    "FoundationOptional": "omnicore.components",
    "ParallelModel": "omnicore.components",
    "EncoderCall": "omnicore.components",
    "ParallelStrategy": "omnicore.components",
    "ParallelStrategyOptional": "omnicore.components",
    "SequenceParallel": "omnicore.components",
    "ParallelStateView": "omnicore.components",
    "Kernel": "omnicore.components",
    "CrossEntropyKernel": "omnicore.components",
    "Logger": "omnicore.components",
    # decoders
    "CodebookDecoder": "omnicore.model.codebook",
    "DepthOptions": "omnicore.model.codebook",
    "Registry": "omnicore.registry",
    "RegistryError": "omnicore.registry",
    # data
    "IGNORE_INDEX": "omnicore.data.chat",
    "ItemLayout": "omnicore.data.chat",
    "RopeLayout": "omnicore.data.positions",
    "Audio": "omnicore.data.media",
    "MediaError": "omnicore.data.media",
    "load_audio": "omnicore.data.media",
    "load_image": "omnicore.data.media",
    "Video": "omnicore.data.media",
    "load_video": "omnicore.data.media",
    "resample": "omnicore.data.media",
    # audio targets
    "target_waveform": "omnicore.data.waveforms",
    "collate_waveforms": "omnicore.data.waveforms",
    # randomness
    "item_generators": "omnicore.data.seeds",
    "ITEM_SEEDS": "omnicore.data.seeds",
    "collate_items": "omnicore.data.seeds",
    # varlen
    "cu_seqlens_from_position_ids": "omnicore.kernels.varlen",
    "plan_varlen": "omnicore.kernels.varlen",
    "mark_varlen": "omnicore.kernels.varlen",
    "is_varlen": "omnicore.kernels.varlen",
    "CU_SEQLENS_KWARGS": "omnicore.kernels.varlen",
    "varlen_from_kwargs": "omnicore.kernels.varlen",
    # kernels
    "cuda_and_package": "omnicore.kernels.common",
    "plain_weight": "omnicore.kernels.common",
    "TorchCrossEntropy": "omnicore.kernels.cross_entropy",
    "rms_norm_modules": "omnicore.kernels.rmsnorm",
    # parallel strategies
    "Violation": "omnicore.components",
    "StrategyPlan": "omnicore.components",
    "PHASES": "omnicore.components",
    "DEFAULT_PHASE": "omnicore.components",
    "FSDP2": "omnicore.parallel.fsdp",
    "NoParallel": "omnicore.parallel.fsdp",
    "BlockStrategy": "omnicore.parallel.block",
    "checkpoint_module": "omnicore.parallel.checkpointing",
    # expert parallelism
    "ExpertParallel": "omnicore.parallel.expert",
    "EPContext": "omnicore.parallel.expert",
    "all_to_all": "omnicore.parallel.expert",
    "regroup": "omnicore.parallel.expert",
    "local_experts_forward": "omnicore.parallel.expert",
    # foundations and weights
    "byte_tokenizer": "omnicore.model.foundation",
    "load_hf_pretrained": "omnicore.model.weights",
    "build_mrope_lm": "omnicore.model.mrope",
    "on_meta": "omnicore.model.loading",
    "plan_checkpoint": "omnicore.model.loading",
    "fill_now": "omnicore.model.loading",
    "embedding_names": "omnicore.model.loading",
    "LoadError": "omnicore.model.loading",
    "save_extra_weights": "omnicore.model.weights",
    "load_extra_weights": "omnicore.model.weights",
    # training
    "warmup_cosine": "omnicore.train.optim",
    # FLOPs
    "model_flops": "omnicore.model.flops",
    "ModelFlops": "omnicore.model.flops",
    "input_units": "omnicore.model.flops",
    "flop_counter": "omnicore.model.flops",
}
"""Each public name and the module it is imported from."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its home module on first use (then cache it in this module).

    Raises:
        AttributeError: ``name`` is not a public name (the message lists them).
    """
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"omnicore.api has no {name!r}; the public names are: {', '.join(__all__)}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
