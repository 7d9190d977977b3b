"""Contract test suites, one per component kind, for a plugin's own tests to subclass.

A suite is a plain class whose ``test_*`` methods pytest collects once a ``Test*`` subclass sets the
component to test::

    from omnicore.testing import EncoderContract

    class TestMyEncoder(EncoderContract):
        name = "myenc"                                  # kind/name as registered ("provider:name" works)
        options = {"config": {"width": 16}}             # options of a tiny, fast instance
        hidden_size = 32

The component is built through a registry exactly as training builds it: by default
``Registry.discover()`` (so the suite also checks that the entry point is installed); set
``plugin = "my_pkg.plugin"`` (or a plugin object) to test an isolated registry of that plugin plus
the built-ins instead, before it is installed.

Encoders and decoders are checked with their processor (``Registry.build_processor``, as data
workers build it): it must be registered with ``ComponentSpec(processor=...)``, build without
constructing any ``nn.Module``, survive a pickle round trip, and agree with the module (its collated
batch gives exactly ``sum(num_tokens)`` output rows or codes).

Every check uses real values from the component (shapes, dtypes, code ranges, exact equality after
reloading). Hooks a subclass may override: ``make_media()`` (the media items to preprocess),
``checkpoint_options(path)`` (options that load a ``save_pretrained`` folder) and the class
attributes documented on each suite.

Meta device: ``with torch.device("meta"): build(...)`` must give a component whose parameters and
buffers all live on ``meta`` with the same names and shapes as a CPU build. transformers and
diffusers models build there from a config (their ``__init__`` only creates tensors and runs
initialisers, which are no-ops on meta). Loading a checkpoint on meta is not checked: reading
weights needs real memory, and omnicore loads checkpoints on CPU before sharding.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import subprocess
import sys
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from omnicore.components import Decoder, Encoder, EncoderOutput, Foundation, Kernel, ParallelStrategy, Processor

HEAVY_MODULES: tuple[str, ...] = ("torch", "transformers", "diffusers")
"""Modules a hook module must not import (``omnicore plugins`` imports every hook module)."""

TINY_LM_CONFIG: dict[str, Any] = {
    "model_type": "qwen2",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
"""The tiny causal LM that kernel and parallel-strategy suites run on."""


# ---- media -----------------------------------------------------------------------------------


def sample_media(modality: str, n: int = 3, seed: int = 0) -> list[Any]:
    """``n`` synthetic media items of ``modality`` that differ in content and size.

    images: ``PIL.Image`` of sizes 28x28 (mode L), 60x45 (RGB), 33x20 (RGB), ... with random pixels;
    audio: :class:`omnicore.data.media.Audio`, mono noise of 0.3 s, 1.1 s, 0.7 s, ... (amplitude 0.1)
    at 16 kHz, with the second at 22.05 kHz (so resampling is exercised).

    Raises:
        ValueError: for another modality (override ``make_media`` in the suite).
    """
    rng = np.random.default_rng(seed)
    if modality == "image":
        from PIL import Image

        sizes = [(28, 28, "L"), (60, 45, "RGB"), (33, 20, "RGB"), (40, 40, "RGB"), (17, 31, "L")]
        out = []
        for i in range(n):
            w, h, mode = sizes[i % len(sizes)]
            shape = (h, w) if mode == "L" else (h, w, 3)
            out.append(Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode))
        return out
    if modality == "audio":
        from omnicore.data.media import Audio

        seconds = [0.3, 1.1, 0.7, 0.5, 1.6]
        out = []
        for i in range(n):
            rate = 22050 if i == 1 else 16000
            samples = (0.1 * rng.standard_normal(int(seconds[i % len(seconds)] * rate))).astype(np.float32)
            out.append(Audio(samples=samples, sample_rate=rate))
        return out
    raise ValueError(f"no sample media for modality {modality!r}; override make_media() in your contract subclass")


def tiny_causal_lm(seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised transformers causal LM of :data:`TINY_LM_CONFIG` (eval mode, CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(TINY_LM_CONFIG, **overrides)
    model_type = kwargs.pop("model_type")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs)).eval()


# ---- the shared base -------------------------------------------------------------------------


def _tensors(module: Any) -> dict[str, torch.Tensor]:
    named = dict(module.named_parameters())
    named.update({f"buffer:{k}": v for k, v in module.named_buffers()})
    return named


class ComponentContract:
    """What every suite shares: building through a registry, and the torch-free hook module."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    """``name`` or ``provider:name`` of the component, as config writes it."""
    options: ClassVar[dict[str, Any]] = {}
    """Options of a small, fast instance (validated by the component's options model)."""
    plugin: ClassVar[Any] = None
    """None: discover installed entry points. Else the hook module (object or dotted name): an isolated
    registry of it plus the built-ins."""
    provider: ClassVar[str] = "plugin-under-test"
    """The provider name given to ``plugin`` in an isolated registry."""
    hook_module: ClassVar[str | None] = None
    """Dotted name of the hook module to import without torch; default: from the registry row."""
    seed: ClassVar[int] = 0
    atol: ClassVar[float] = 1e-5
    rtol: ClassVar[float] = 1e-4
    """Tolerances for results that may legitimately differ in float rounding (batched vs alone)."""

    # -- helpers --------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _omnicore_one_thread(self):
        """One intra-op thread: tiny models gain nothing from more, and a busy machine makes OpenMP spin."""
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(old)

    def registry(self) -> Any:
        """The registry the component is built from (see :attr:`plugin`)."""
        from omnicore.registry import Registry
        from omnicore.testing.fakes import isolated_registry

        if self.plugin is None:
            return Registry.discover()
        return isolated_registry([(self.plugin, self.provider)], builtins=True)

    def build_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the factory besides ``options`` (``hidden_size`` for encoders/decoders)."""
        return {}

    def build(self, options: dict[str, Any] | None = None, *, seed: int | None = None, registry: Any = None) -> Any:
        """Build the component from ``options`` (default :attr:`options`) after seeding torch."""
        torch.manual_seed(self.seed if seed is None else seed)
        reg = registry or self.registry()
        return reg.build(self.kind, self.name, copy.deepcopy(self.options if options is None else options), **self.build_kwargs())

    def checkpoint_options(self, path: str) -> dict[str, Any]:
        """Options that load a ``save_pretrained`` folder: :attr:`options` without ``config``, plus
        ``checkpoint``. Override when the component spells it otherwise."""
        opts = {k: v for k, v in copy.deepcopy(self.options).items() if k != "config"}
        opts["checkpoint"] = path
        return opts

    def _row(self) -> Any:
        reg = self.registry()
        spec = reg.resolve(self.kind, self.name)
        rows = [r for r in reg.components(self.kind) if r.spec is spec]
        return rows[0]

    def _hook_module_name(self) -> str:
        if self.hook_module:
            return self.hook_module
        if isinstance(self.plugin, str):
            return self.plugin
        if self.plugin is not None:
            return self.plugin.__name__
        row = self._row()
        if row.entry_point == "builtin":
            return "omnicore.builtins"
        return row.entry_point.partition(":")[0]

    # -- checks shared by every kind --------------------------------------------------------

    def test_registered(self):
        """The component resolves, has a description, and its options model is strict and documented."""
        row = self._row()
        assert row.status == "available", f"{self.kind}/{self.name} is {row.status}: {row.reason}"
        assert row.spec.description.strip(), f"{row.spec.key}: give the ComponentSpec a one-line description"
        if row.spec.options_model:
            from omnicore.registry import import_target

            model = import_target(row.spec.options_model)
            assert model.model_config.get("extra") == "forbid", f"{row.spec.options_model}: set model_config = ConfigDict(extra='forbid')"
            undocumented = [n for n, f in model.model_fields.items() if not f.description]
            assert not undocumented, f"{row.spec.options_model}: fields without a description: {undocumented}"

    @pytest.mark.cli  # a fresh interpreter: the quick lane (`-m "not cli"`) leaves it out
    def test_hook_module_imports_without_torch(self):
        """The hook module imports in a fresh interpreter without pulling in torch/transformers/diffusers."""
        module = self._hook_module_name()
        code = (
            "import importlib, sys\n"
            f"importlib.import_module({module!r})\n"
            f"print(','.join(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, f"importing {module} failed:\n{proc.stderr[-2000:]}"
        heavy = proc.stdout.strip()
        assert heavy == "", f"importing hook module {module} imported {heavy}; import heavy code only in the spec's target module"


class ModuleComponentContract(ComponentContract):
    """Shared by encoders and decoders, which are ``nn.Module`` s built with ``hidden_size``, and
    whose data side is a :class:`~omnicore.components.Processor` built apart from the options."""

    hidden_size: ClassVar[int] = 32

    def build_kwargs(self) -> dict[str, Any]:
        return {"hidden_size": self.hidden_size}

    def build_processor(self, options: dict[str, Any] | None = None, *, registry: Any = None) -> Any:
        """The component's processor from ``options`` (default :attr:`options`), as data workers build it."""
        reg = registry or self.registry()
        opts = copy.deepcopy(self.options if options is None else options)
        return reg.build_processor(self.kind, self.name, opts)

    def make_media(self, modality: str) -> list[Any]:
        """Media items for the checks (default: :func:`sample_media` of the component's modality)."""
        return sample_media(modality, n=3, seed=self.seed)

    @property
    def _proc(self) -> Any:
        """The processor of :attr:`options`, built once per test."""
        if getattr(self, "_proc_cache", None) is None:
            self._proc_cache = self.build_processor()
        return self._proc_cache

    def _run(self, module: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The module's rows for a collated batch: ``forward`` (encoders) or ``encode`` (decoders)."""
        with torch.no_grad():
            return _rows(module(batch))[0] if self.kind == "encoder" else module.encode(batch)

    def test_builds_on_meta_device(self):
        """``with torch.device("meta")``: every parameter and buffer on meta, same names and shapes as on CPU."""
        cpu = self.build()
        with torch.device("meta"):
            meta = self.build()
        want = {k: tuple(v.shape) for k, v in _tensors(cpu).items()}
        got = {k: tuple(v.shape) for k, v in _tensors(meta).items()}
        assert got == want
        real = [k for k, v in _tensors(meta).items() if not v.is_meta]
        assert not real, f"built under torch.device('meta') but these tensors are real: {real[:5]}"

    def test_processor_builds_from_options_alone(self, monkeypatch):
        """The spec registers ``processor=``, and building it constructs no ``nn.Module`` (no weights)."""
        spec = self._row().spec
        assert spec.processor, (
            f"{spec.key}: register the data side with ComponentSpec(processor='package.module:factory'); without it every "
            "data worker builds the whole component with its weights"
        )
        built: list[str] = []
        init = nn.Module.__init__

        def counting_init(module, *args, **kwargs):
            built.append(type(module).__name__)
            init(module, *args, **kwargs)

        monkeypatch.setattr(nn.Module, "__init__", counting_init)
        proc = self.build_processor()
        monkeypatch.undo()
        assert not built, f"building the processor of {spec.key} constructed nn.Modules: {built[:5]}"
        assert isinstance(proc, Processor) and not isinstance(proc, nn.Module)
        assert proc.modality in spec.modalities, f"spec.modalities {spec.modalities} lacks the processor's {proc.modality!r}"

    def _assert_processors_agree(self, proc: Any, other: Any, what: str) -> None:
        """``other`` gives ``proc``'s features (equal tensors, same keys) and token counts for every
        sample medium; ``what`` names ``other`` in the messages."""
        for i, media in enumerate(self.make_media(proc.modality)):
            a, b = proc.preprocess(media), other.preprocess(media)
            assert a.keys() == b.keys(), f"item {i}: {what} gives other feature keys"
            for k in a:
                assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), f"item {i}: feature {k!r} differs in {what}"
            assert other.num_tokens(b) == proc.num_tokens(a), f"item {i}: {what} counts other tokens"

    def test_module_holds_its_processor(self):
        """The built module's ``processor`` attribute is a :class:`Processor` that agrees with the one
        built apart from the same options: the same features and token counts for every sample."""
        held = getattr(self.build(), "processor", None)
        assert isinstance(held, Processor), (
            f"{self.kind}/{self.name}: the module must hold its data side as .processor (core API 2.0; got {type(held).__name__})"
        )
        self._assert_processors_agree(self.build_processor(), held, "the module's .processor")

    def test_processor_is_picklable(self):
        """A pickle round trip of the processor (spawned data workers) gives equal features and token counts."""
        proc = self.build_processor()
        self._assert_processors_agree(proc, pickle.loads(pickle.dumps(proc)), "the processor after pickling")

    def test_processor_agrees_with_module(self):
        """The processor's collate feeds the module, which gives ``sum(num_tokens)`` rows, item by item too."""
        proc, module = self.build_processor(), self.build().eval()
        assert proc.modality == module.modality
        feats = [proc.preprocess(m) for m in self.make_media(proc.modality)]
        counts = [int(proc.num_tokens(f)) for f in feats]
        assert self._run(module, proc.collate(feats)).shape[0] == sum(counts), f"num_tokens {counts}"
        for i, f in enumerate(feats):
            assert self._run(module, proc.collate([f])).shape[0] == counts[i], f"item {i}"

    core_foundation: ClassVar[dict[str, Any] | None] = None
    """The foundation (``{"name": ..., "options": ...}``, as ``model.foundation``) that
    :meth:`test_core_paths` runs the component with; None: the built-in ``hf_causal_lm`` of
    :data:`TINY_LM_CONFIG` with :attr:`hidden_size`. Set it for a component that needs its own
    family's foundation (an encoder whose layer rows only it takes)."""
    core_export: ClassVar[bool] = True
    """Whether :meth:`test_core_paths` also exports; False only where the foundation's own export
    cannot hold this configuration (say why in the subclass)."""

    def _core_media(self, monkeypatch: Any) -> dict[str, Any]:
        """:meth:`make_media`'s items by name (``media-0``, ...), which the data side's loaders
        return for a path of that name (so any medium works, without files)."""
        from omnicore.data import chat

        media = {f"media-{i}": m for i, m in enumerate(self.make_media(self._proc.modality))}
        monkeypatch.setitem(chat.LOADERS, self._proc.modality, lambda path, **_: media[os.path.basename(path)])
        monkeypatch.setattr(chat, "load_video", lambda path, **_: media[os.path.basename(path)])  # a processor with audio_track
        return media

    def _core_config(self, folder: Any, keys: list[str]) -> Any:
        """The run config of :meth:`test_core_paths`: the tiny foundation and this component; one
        held-out line per medium, written under ``folder``: for an encoder a question about it and a
        text answer, for a decoder a request and the medium as the answer."""
        import json

        from omnicore.config import Config

        m = self._proc.modality
        lines = []
        for i, key in enumerate(keys):
            if self.kind == "encoder":
                user, answer = [{"type": m, "path": key}, {"type": "text", "text": "What is it?"}], f"item {i}"
            else:
                user, answer = f"Make item {i}.", [{"type": m, "path": key}]
            lines.append({"task": "describe", "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
        (folder / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        lm = dict(TINY_LM_CONFIG, hidden_size=self.hidden_size, max_position_embeddings=4096)
        lm.pop("vocab_size")
        foundation = self.core_foundation or {"name": "hf_causal_lm", "options": {"config": lm}}
        return Config.model_validate({
            "run": {"output_dir": str(folder / "run"), "seed": self.seed},
            "model": {"foundation": copy.deepcopy(foundation),
                      f"{self.kind}s": {m: {"name": self.name, "options": copy.deepcopy(self.options)}}},
            "data": {"train": str(folder / "eval.jsonl"), "eval": str(folder / "eval.jsonl"), "max_tokens": 4096},
            "generate": {"max_new_tokens": 3, "batch_size": 2},
        })  # fmt: skip

    def _core_model(self, cfg: Any, registry: Any) -> tuple[Any, Any, Any]:
        """``(model, tokenizer, chat processor)`` of ``cfg``, built through ``registry`` as training builds them."""
        from omnicore.data.chat import ChatProcessor
        from omnicore.model.build import build_omni_model

        model, tokenizer = build_omni_model(cfg, registry)
        return model, tokenizer, ChatProcessor.for_model(tokenizer, model, cfg.data)

    def _core_export(self, model: Any, tokenizer: Any, cfg: Any, registry: Any, folder: Any, val: dict[str, Any]) -> None:
        """Export ``model`` (``write_export``), build it back through ``registry`` from the export's
        ``omnicore.yaml`` and check that it gives the held-out loss ``val`` of :meth:`test_core_paths`."""
        from omnicore.checkpoint.export import write_export
        from omnicore.eval.heldout import heldout_loss
        from omnicore.eval.loading import model_config_from_export

        write_export(model, tokenizer, cfg, folder)
        back = cfg.model_copy(update={"model": model_config_from_export(folder)})
        model2, _, processor2 = self._core_model(back, registry)
        val2 = heldout_loss(model2, processor2, cfg.resolve_path(cfg.data.eval), cfg.data.max_tokens)
        assert val2["val_loss"] == pytest.approx(val["val_loss"], rel=1e-5), "the export gives another held-out loss"

    def _core_step(self, model: Any, processor: Any, samples: list[Any], module: Any) -> Any:
        """A training step's forward and backward on ``samples`` (collated by the processors, as the
        data side does); asserts a finite loss and a gradient on ``module``; returns the output."""
        from omnicore.data.packing import collate

        model.train()
        out = model(collate([processor.encode(s) for s in samples], processor.encoders, processor.decoders))
        out.loss_sum.backward()
        assert torch.isfinite(out.loss_sum), "training step: non-finite loss"
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        assert grads and any(g is not None and bool(g.abs().sum() > 0) for g in grads), (
            f"training step: no gradient reached the {self.kind}"
        )
        model.zero_grad(set_to_none=True)
        return out


# ---- encoders --------------------------------------------------------------------------------


def _rows(out: Any) -> list[torch.Tensor]:
    """An encoder's outputs as a list: ``[out]``, or an :class:`EncoderOutput`'s ``embeds`` then its ``layer_embeds``."""
    return [out.embeds, *out.layer_embeds] if isinstance(out, EncoderOutput) else [out]


class EncoderContract(ModuleComponentContract):
    """Contract of an input-side encoder (:class:`omnicore.components.Encoder`).

    Set ``name``, ``options`` and ``hidden_size``; override ``make_media()`` for a modality other
    than image or audio. ``make_media`` must return at least two items whose token counts may differ.
    """

    kind: ClassVar[str] = "encoder"
    seeded_init: ClassVar[bool] = True
    """Whether two seeds give different weights (False for a component with no random init)."""

    def _features(self, enc: Any, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        proc = self.build_processor(options)
        media = self.make_media(enc.modality)
        assert len(media) >= 2, "make_media() must return at least two items"
        return [proc.preprocess(m) for m in media]

    def _encode(self, enc: Any, feats: list[dict[str, Any]]) -> torch.Tensor:
        """The placeholder rows ``[N, hidden_size]`` of ``feats`` (an :class:`EncoderOutput`'s ``embeds``)."""
        return self._encode_all(enc, feats)[0]

    def _encode_all(self, enc: Any, feats: list[dict[str, Any]]) -> list[torch.Tensor]:
        """Every output of ``feats``: the placeholder rows, then the layer rows of an :class:`EncoderOutput`."""
        with torch.no_grad():
            return _rows(enc(self._proc.collate(feats)))

    def test_implements_protocol(self):
        enc = self.build()
        assert isinstance(enc, nn.Module) and isinstance(enc, Encoder)
        assert isinstance(enc.modality, str) and enc.modality
        assert enc.modality in self._row().spec.modalities, f"spec.modalities {self._row().spec.modalities} lacks {enc.modality!r}"

    def test_output_shape_and_dtype(self):
        """forward(collate(items)) is ``[sum num_tokens, hidden_size]``, floating point, finite."""
        enc = self.build().eval()
        feats = self._features(enc)
        counts = [int(self._proc.num_tokens(f)) for f in feats]
        assert all(c >= 1 for c in counts), counts
        for k, out in enumerate(self._encode_all(enc, feats)):  # the placeholder rows, then any layer rows (EncoderOutput)
            assert tuple(out.shape) == (sum(counts), self.hidden_size), f"output {k}"
            assert out.dtype.is_floating_point
            assert torch.isfinite(out).all()

    def test_num_tokens_matches_forward_per_item(self):
        """Each item alone gives exactly ``num_tokens(item)`` rows."""
        enc = self.build().eval()
        for i, f in enumerate(self._features(enc)):
            assert self._encode(enc, [f]).shape[0] == self._proc.num_tokens(f), f"item {i}"

    def test_collate_keeps_item_order(self):
        """Item ``i`` encoded alone equals its slice of the batch output, layer rows too (and items differ)."""
        enc = self.build().eval()
        feats = self._features(enc)
        outs = self._encode_all(enc, feats)
        start = 0
        slices = []
        for i, f in enumerate(feats):
            n = int(self._proc.num_tokens(f))
            for k, (alone, out) in enumerate(zip(self._encode_all(enc, [f]), outs, strict=True)):
                torch.testing.assert_close(
                    alone, out[start : start + n], atol=self.atol, rtol=self.rtol, msg=lambda m, i=i, k=k: f"item {i}, output {k}: {m}"
                )
            slices.append(outs[0][start : start + n])
            start += n
        assert not torch.allclose(slices[0].mean(0), slices[1].mean(0)), "different media gave the same embeddings"

    def test_state_dict_round_trip(self):
        """Two seeds differ; loading one's state_dict into the other gives identical outputs."""
        a, b = self.build(seed=self.seed).eval(), self.build(seed=self.seed + 1).eval()
        feats = self._features(a)
        out_a = self._encode_all(a, feats)
        if self.seeded_init:
            assert not torch.equal(out_a[0], self._encode(b, feats)), "two seeds built identical encoders"
        b.load_state_dict(a.state_dict())
        torch.testing.assert_close(self._encode_all(b, feats), out_a, atol=0, rtol=0)

    def test_save_pretrained_round_trip(self, tmp_path):
        """``save_pretrained(dir)`` then ``build(checkpoint=dir)`` (under another seed): identical outputs and tensors."""
        a = self.build().eval()
        feats = self._features(a)
        out = self._encode_all(a, feats)
        a.save_pretrained(str(tmp_path / "ckpt"))
        b = self.build(self.checkpoint_options(str(tmp_path / "ckpt")), seed=self.seed + 123).eval()
        feats_b = self._features(b, self.checkpoint_options(str(tmp_path / "ckpt")))
        torch.testing.assert_close(self._encode_all(b, feats_b), out, atol=0, rtol=0)
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k

    def test_dummy_batch_reaches_every_parameter(self):
        """dummy_batch() forward is ``[n, hidden_size]`` (each output of an :class:`EncoderOutput`); ``0 * sum`` of the
        outputs backward gives every trainable parameter a grad, as the core's dummy pass does."""
        enc = self.build().train()
        outs = _rows(enc(enc.dummy_batch()))
        for out in outs:
            assert out.ndim == 2 and out.shape[0] >= 1 and out.shape[1] == self.hidden_size, tuple(out.shape)
        (0 * sum(out.sum() for out in outs)).backward()
        trainable = [(n, p) for n, p in enc.named_parameters() if p.requires_grad]
        assert trainable, "the encoder has no trainable parameters"
        missing = [n for n, p in trainable if p.grad is None]
        assert not missing, f"parameters without a grad after the dummy pass (FSDP would hang): {missing[:5]}"

    def test_core_paths(self, tmp_path, monkeypatch):
        """Every path the core calls with this encoder in a tiny model (the built-in foundation,
        built through the registry as training builds it), each through the component contract (the
        module's ``.processor``, never a ``collate`` of the module): a training step (loss finite,
        gradients reach the encoder), validation's held-out loss and task accuracy
        (``heldout_loss``, ``task_accuracy``), ``omnicore eval``'s scoring and ``omnicore generate``'s
        answers (``score_samples``, ``generate_answers``), and an export (``write_export``) that
        builds back, through the registry, to the same held-out loss."""
        from omnicore.data.jsonl import Part
        from omnicore.eval.generate import generate_answers, user_prompt
        from omnicore.eval.heldout import heldout_loss
        from omnicore.eval.scoring import answer_samples, score_samples, task_accuracy

        media = self._core_media(monkeypatch)
        cfg, registry = self._core_config(tmp_path, list(media)), self.registry()
        model, tokenizer, processor = self._core_model(cfg, registry)
        samples = answer_samples(cfg)
        self._core_step(model, processor, samples, model.encoders[self._proc.modality])  # training
        # validation (eval.every): held-out loss and task accuracy (eval.task_samples)
        path = cfg.resolve_path(cfg.data.eval)
        val = heldout_loss(model, processor, path, cfg.data.max_tokens)
        assert math.isfinite(val["val_loss"]) and val["val_samples"] == len(samples), val
        acc = task_accuracy(cfg, model, tokenizer, processor, len(samples))
        assert acc["val_acc_samples"] == len(samples), acc
        # omnicore eval and omnicore generate
        summary, rows = score_samples(cfg, model, tokenizer, processor, samples, progress=False)
        assert summary["total"] == len(samples) and all(isinstance(r["answer"], str) for r in rows)
        prompts = [
            processor.encode(user_prompt("What is it?", [Part(self._proc.modality, str(tmp_path / k))]), prompt_only=True) for k in media
        ]
        answers = list(generate_answers(cfg, model, tokenizer, processor, prompts))
        assert len(answers) == len(media) and all(isinstance(a["text"], str) for a in answers)
        if self.core_export:  # export, built back through the registry
            self._core_export(model, tokenizer, cfg, registry, tmp_path / "export", val)


# ---- decoders --------------------------------------------------------------------------------


class DecoderContract(ModuleComponentContract):
    """Contract of an output-side decoder (:class:`omnicore.components.Decoder`).

    ``image_size``: the ``(width, height)`` :meth:`decode` must return for images; default
    ``(d.image_size, d.image_size)`` when the decoder has an int ``image_size``.
    """

    kind: ClassVar[str] = "decoder"
    image_size: ClassVar[tuple[int, int] | None] = None
    seeded_init: ClassVar[bool] = True

    def _batch(self, dec: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        proc = self._proc
        feats = [proc.preprocess(m) for m in self.make_media(dec.modality)]
        assert len(feats) >= 2, "make_media() must return at least two items"
        return feats, proc.collate(feats)

    def test_core_paths(self, tmp_path, monkeypatch):
        """Every path the core calls with this decoder in a tiny model (the built-in foundation,
        built through the registry as training builds it), each through the component contract: a
        training step (its loss part finite, gradients reach the decoder), validation's held-out
        loss (``heldout_loss``), generation that opens an item (``generate_answers``, the opening
        token forced: the codes come from the decoder's ``head`` and ``decode`` gives the medium),
        and an export (``write_export``) that builds back, through the registry, to the same loss."""
        from omnicore.data.jsonl import read_jsonl
        from omnicore.eval.generate import generate_answers, user_prompt
        from omnicore.eval.heldout import heldout_loss

        m = self._proc.modality
        media = self._core_media(monkeypatch)
        cfg, registry = self._core_config(tmp_path, list(media)), self.registry()
        model, tokenizer, processor = self._core_model(cfg, registry)
        path = cfg.resolve_path(cfg.data.eval)
        samples = list(read_jsonl(path))
        out = self._core_step(model, processor, samples, model.decoders[m])  # training
        assert out.decoder_targets.get(m, 0) > 0, "training step: the decoder's codes are not targets"
        val = heldout_loss(model, processor, path, cfg.data.max_tokens)  # validation (eval.every)
        assert math.isfinite(val.get(f"val_loss/decoder.{m}", math.nan)), val
        # generation (omnicore generate, samples.every): the LM head made to open an item at once
        start = model.token_ids["decoder_start"][m]

        def open_item(module: Any, args: Any, logits: torch.Tensor) -> torch.Tensor:
            return logits.index_fill(-1, torch.tensor([start], device=logits.device), 1e4)

        one = cfg.model_copy(update={"generate": cfg.generate.model_copy(update={"max_new_tokens": 1})})
        hook = model.lm.get_output_embeddings().register_forward_hook(open_item)
        try:
            prompts = [processor.encode(user_prompt(f"Make item {i}."), prompt_only=True) for i in range(2)]
            answers = list(generate_answers(one, model, tokenizer, processor, prompts))
        finally:
            hook.remove()
        assert [len(a["images"].get(m, [])) for a in answers] == [1, 1], "generation: an opened item gave no medium"
        if self.core_export:  # export, built back through the registry
            self._core_export(model, tokenizer, cfg, registry, tmp_path / "export", val)

    def test_implements_protocol(self):
        dec = self.build()
        assert isinstance(dec, nn.Module) and isinstance(dec, Decoder)
        assert isinstance(dec.codebook_size, int) and dec.codebook_size > 1
        assert dec.modality in self._row().spec.modalities

    def test_encode_gives_codes_in_range(self):
        """encode(batch) is int64 ``[sum num_tokens]`` (``[sum num_tokens, K]`` with ``num_codebooks``
        K > 1) with every code in ``[0, codebook_size)``."""
        dec = self.build().eval()
        feats, batch = self._batch(dec)
        with torch.no_grad():
            codes = dec.encode(batch)
        k = _codebooks(dec)
        assert codes.dtype == torch.long and (codes.ndim == 1 if k == 1 else tuple(codes.shape[1:]) == (k,))
        assert codes.shape[0] == sum(int(self._proc.num_tokens(f)) for f in feats)
        assert int(codes.min()) >= 0 and int(codes.max()) < dec.codebook_size

    def test_collate_keeps_item_order(self):
        dec = self.build().eval()
        feats, batch = self._batch(dec)
        with torch.no_grad():
            codes = dec.encode(batch)
            start = 0
            for i, f in enumerate(feats):
                n = int(self._proc.num_tokens(f))
                assert torch.equal(dec.encode(self._proc.collate([f])), codes[start : start + n]), f"item {i}"
                start += n

    def test_fixed_codes_hold_through_training(self):
        """A decoder whose ``fixed_codes`` is true in train mode gives the same codes in train and
        eval mode, and still the same after an optimizer step on all its trainable parameters
        (the promise that lets the core reuse codes, :mod:`omnicore.model.code_cache`)."""
        dec = self.build().train()
        if not getattr(dec, "fixed_codes", False):
            pytest.skip("fixed_codes is absent or false: every target is encoded on every step")
        _, batch = self._batch(dec)
        with torch.no_grad():
            before = dec.encode(batch)
            assert torch.equal(dec.eval().encode(batch), before), "encode differs between train and eval mode"
        dec.train()
        trainable = [p for p in dec.parameters() if p.requires_grad]
        for p in trainable:  # every trainable parameter moves by 0.1 (a code that depends on one changes)
            p.grad = torch.full_like(p, 0.1)
        torch.optim.SGD(trainable, lr=1.0).step()
        assert getattr(dec, "fixed_codes", False), "an optimizer step turned fixed_codes false"
        with torch.no_grad():
            assert torch.equal(dec.encode(batch), before), "fixed_codes is true, but an optimizer step changed the codes"

    def test_embed_and_head_shapes(self):
        """embed: ``[N] -> [N, hidden_size]`` float (``[N, K]`` codes with K codebooks); head:
        ``[N, hidden_size] -> [N, codebook_size]`` float."""
        dec = self.build().eval()
        codes = torch.tensor([0, 1, dec.codebook_size - 1, 1])
        k = _codebooks(dec)
        if k > 1:  # every codebook of a frame takes the same entry
            codes = codes.unsqueeze(1).expand(4, k).contiguous()
        e = dec.embed(codes)
        assert tuple(e.shape) == (4, self.hidden_size) and e.dtype.is_floating_point
        assert torch.equal(e[1], e[3]) and not torch.equal(e[0], e[1])
        logits = dec.head(torch.randn(4, self.hidden_size))
        assert tuple(logits.shape) == (4, dec.codebook_size) and logits.dtype.is_floating_point
        assert torch.isfinite(logits).all()

    def test_decode_returns_medium(self):
        """decode(codes of one item) returns the medium; for images a PIL image of the expected size,
        for audio an :class:`omnicore.data.media.Audio` (1-D float32 samples in [-1, 1], rate > 0)."""
        dec = self.build().eval()
        feats, batch = self._batch(dec)
        with torch.no_grad():
            codes = dec.encode(batch)[: int(self._proc.num_tokens(feats[0]))]
            out = dec.decode(codes)
        assert out is not None
        if dec.modality == "image":
            from PIL import Image

            assert isinstance(out, Image.Image)
            want = self.image_size or ((dec.image_size, dec.image_size) if isinstance(getattr(dec, "image_size", None), int) else None)
            if want is not None:
                assert out.size == tuple(want)
        if dec.modality == "audio":
            from omnicore.data.media import Audio

            assert isinstance(out, Audio) and int(out.sample_rate) > 0
            assert out.samples.dtype == np.float32 and out.samples.ndim == 1 and out.samples.size > 0
            assert np.abs(out.samples).max() <= 1.0

    def test_dummy_codes_reach_every_parameter(self):
        """dummy_codes() are in range; ``0 * head(embed(codes)).sum()`` backward reaches every trainable parameter."""
        dec = self.build().train()
        codes = dec.dummy_codes()
        k = _codebooks(dec)
        assert codes.dtype == torch.long and codes.ndim == (1 if k == 1 else 2) and codes.numel() >= 1
        assert int(codes.min()) >= 0 and int(codes.max()) < dec.codebook_size
        h = dec.embed(codes)
        dummy = 0 * dec.head(h).sum()
        if k > 1:
            dummy = dummy + 0 * dec.depth_logits(h, codes).sum()
        dummy.backward()
        trainable = [(n, p) for n, p in dec.named_parameters() if p.requires_grad]
        assert trainable, "the decoder has no trainable parameters"
        missing = [n for n, p in trainable if p.grad is None]
        assert not missing, f"trainable parameters that embed/head never reach (FSDP would hang): {missing[:5]}"

    def _outputs(self, dec: Any, batch: dict[str, Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            codes = dec.encode(batch)
            hidden = torch.linspace(-1, 1, 3 * self.hidden_size).reshape(3, self.hidden_size)
            out = [codes, dec.embed(codes), dec.head(hidden)]
            if _codebooks(dec) > 1:
                out.append(dec.depth_logits(hidden, codes[:3]))
            return out

    def test_depth_generation_equals_teacher_forcing(self):
        """With ``num_codebooks`` K > 1: ``depth_logits`` is ``[N, K-1, C]``, its row ``k - 1`` does not
        depend on codes ``k..K-1`` (causal), and greedy ``depth_generate`` gives codes whose
        teacher-forced argmax is themselves."""
        dec = self.build().eval()
        k = _codebooks(dec)
        if k == 1:
            pytest.skip("one codebook per frame: no depth decoder")
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(5, self.hidden_size, generator=g)
        codes = torch.randint(0, dec.codebook_size, (5, k), generator=g)
        with torch.no_grad():
            logits = dec.depth_logits(hidden, codes)
            assert tuple(logits.shape) == (5, k - 1, dec.codebook_size)
            changed = codes.clone()
            changed[:, -1] = (changed[:, -1] + 1) % dec.codebook_size
            torch.testing.assert_close(dec.depth_logits(hidden, changed), logits, rtol=0, atol=0)
            first = dec.head(hidden).argmax(-1)
            got = dec.depth_generate(hidden, first, lambda lg, _k: lg.argmax(-1))
            assert tuple(got.shape) == (5, k) and torch.equal(got[:, 0], first)
            assert torch.equal(dec.depth_logits(hidden, got).argmax(-1), got[:, 1:])

    def test_state_dict_round_trip(self):
        a, b = self.build(seed=self.seed).eval(), self.build(seed=self.seed + 1).eval()
        _, batch = self._batch(a)
        want = self._outputs(a, batch)
        if self.seeded_init:
            assert any(not torch.equal(x, y) for x, y in zip(want, self._outputs(b, batch))), "two seeds built identical decoders"
        b.load_state_dict(a.state_dict())
        for x, y in zip(want, self._outputs(b, batch)):
            torch.testing.assert_close(y, x, atol=0, rtol=0)

    def test_save_pretrained_round_trip(self, tmp_path):
        a = self.build().eval()
        _, batch = self._batch(a)
        want = self._outputs(a, batch)
        a.save_pretrained(str(tmp_path / "ckpt"))
        b = self.build(self.checkpoint_options(str(tmp_path / "ckpt")), seed=self.seed + 123).eval()
        for x, y in zip(want, self._outputs(b, batch)):
            torch.testing.assert_close(y, x, atol=0, rtol=0)
        with torch.no_grad():
            proc_b = self.build_processor(self.checkpoint_options(str(tmp_path / "ckpt")))
            n = int(proc_b.num_tokens(proc_b.preprocess(self.make_media(b.modality)[0])))
            ia, ib = a.decode(want[0][:n]), b.decode(want[0][:n])
        assert np.array_equal(_medium_array(ia), _medium_array(ib))


def _codebooks(decoder: Any) -> int:
    """A decoder's codes per frame (its optional ``num_codebooks``; 1 without it)."""
    return int(getattr(decoder, "num_codebooks", 1) or 1)


def _medium_array(medium: Any) -> np.ndarray:
    """A decoded item as an array to compare: an ``Audio``'s samples (with its rate), else ``np.asarray``."""
    if hasattr(medium, "samples") and hasattr(medium, "sample_rate"):
        return np.append(np.asarray(medium.samples, dtype=np.float64), float(medium.sample_rate))
    return np.asarray(medium)


# ---- foundations -----------------------------------------------------------------------------


class FoundationContract(ComponentContract):
    """Contract of a foundation (:class:`omnicore.components.Foundation`): tokenizer, causal LM, meta build."""

    kind: ClassVar[str] = "foundation"
    text: ClassVar[str] = "omnicore: hello, wörld 123"

    def test_implements_protocol(self):
        assert isinstance(self.build(), Foundation)

    def test_tokenizer_round_trip(self):
        tok = self.build().build_tokenizer()
        ids = tok(self.text, add_special_tokens=False)["input_ids"]
        assert len(ids) >= 1 and all(0 <= i < len(tok) for i in ids)
        assert tok.decode(ids) == self.text

    def _model(self, foundation: Any, vocab: int) -> Any:
        from omnicore.model.loading import fill_now

        model = foundation.build_model(vocab_size=vocab)
        if torch.get_default_device().type != "meta":
            model = fill_now(model)  # a checkpoint returned on meta (sharded loading) is read here, whole
        return model.eval() if hasattr(model, "eval") else model

    def test_model_logits_shape(self):
        """build_model(vocab_size=V) takes ids ``[1, T]`` and gives logits ``[1, T, >=V]``; widths agree."""
        f = self.build()
        vocab = len(f.build_tokenizer()) + 5
        model = self._model(f, vocab)
        hidden = model.config.get_text_config().hidden_size
        emb = model.get_input_embeddings()
        assert emb.num_embeddings >= vocab and emb.embedding_dim == hidden
        ids = torch.arange(7).unsqueeze(0) % vocab
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape[:2] == (1, 7) and logits.shape[2] >= vocab
        assert torch.isfinite(logits).all()

    def test_builds_on_meta_device(self):
        f = self.build()
        vocab = len(f.build_tokenizer())
        cpu = self._model(f, vocab)
        with torch.device("meta"):
            meta = self._model(f, vocab)
        assert {k: tuple(v.shape) for k, v in _tensors(meta).items()} == {k: tuple(v.shape) for k, v in _tensors(cpu).items()}
        real = [k for k, v in _tensors(meta).items() if not v.is_meta]
        assert not real, f"built under torch.device('meta') but these tensors are real: {real[:5]}"

    def test_save_pretrained_round_trip(self, tmp_path):
        """The model's ``save_pretrained`` folder, given as ``checkpoint``, gives identical logits."""
        f = self.build()
        vocab = len(f.build_tokenizer())
        model = self._model(f, vocab)
        model.save_pretrained(str(tmp_path / "ckpt"))
        g = self.build(self.checkpoint_options(str(tmp_path / "ckpt")), seed=self.seed + 123)
        back = self._model(g, vocab)
        ids = torch.arange(9).unsqueeze(0) % vocab
        with torch.no_grad():
            torch.testing.assert_close(back(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)


# ---- kernels ---------------------------------------------------------------------------------


class KernelContract(ComponentContract):
    """Contract of a kernel (:class:`omnicore.components.Kernel`).

    ``activate`` runs on a tiny transformers causal LM (:func:`tiny_causal_lm`); for ``op ==
    "attention"`` the logits must match transformers' eager attention within ``atol``, on a packed
    row (``position_ids`` restarting at 0 for a second sample, no attention mask, ``use_cache=False``)
    as omnicore trains, and the second sample must equal that sample run alone. For ``rmsnorm`` and
    ``swiglu`` the activated model's logits must match the model's own within ``atol``, and
    ``activate`` must have changed something (a module's class or forward; for attention, the
    model's attention implementation).

    ``op == "cross_entropy"``: the kernel must have ``linear_cross_entropy_sum``; when available, its
    loss and the gradients of hidden, weight and bias must equal the plain PyTorch reference (fp32
    logits, ``F.cross_entropy(reduction="sum")``) within ``ce_rtol`` (relative), on random fp32 input
    with ignored labels, run on ``device`` (default: CUDA when torch sees it, else CPU).
    """

    kind: ClassVar[str] = "kernel"
    atol: ClassVar[float] = 1e-4
    ce_rtol: ClassVar[float] = 1e-5
    device: ClassVar[str | None] = None

    def test_implements_protocol(self):
        k = self.build()
        assert isinstance(k, Kernel)
        assert isinstance(k.op, str) and k.op

    def test_available_returns_flag_and_reason(self):
        result = self.build().available()
        assert isinstance(result, tuple) and len(result) == 2
        ok, reason = result
        assert isinstance(ok, bool) and isinstance(reason, str) and reason.strip()

    def test_activate_on_tiny_model(self):
        k = self.build()
        ok, reason = k.available()
        if not ok:
            pytest.skip(f"kernel {self.name} unavailable here: {reason}")
        model = tiny_causal_lm(self.seed)
        ref = copy.deepcopy(model)
        ref.set_attn_implementation("eager")
        before = [(type(m), m.__dict__.get("forward")) for m in model.modules()]
        k.activate(model)
        if k.op in ("rmsnorm", "swiglu"):
            after = [(type(m), m.__dict__.get("forward")) for m in model.modules()]
            assert after != before, f"kernel {self.name} (op {k.op}): activate() changed no module's class or forward; it installed nothing"
        elif k.op == "attention":
            assert model.config._attn_implementation != "sdpa" or self.name.split(":")[-1] == "sdpa", (
                f"kernel {self.name}: activate() left the model on transformers' default sdpa attention"
            )
        ids = torch.tensor([[5, 9, 3, 7, 1, 2, 8, 4, 6, 11]])
        pos = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]])  # two packed samples
        with torch.no_grad():
            got = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            want = ref(input_ids=ids, position_ids=pos, use_cache=False).logits
        assert got.shape == want.shape and torch.isfinite(got).all()
        if k.op == "attention":
            torch.testing.assert_close(got, want, atol=self.atol, rtol=self.rtol)
            # the packed second sample sees only itself: it equals that sample run alone
            with torch.no_grad():
                alone = ref(input_ids=ids[:, 6:], position_ids=pos[:, 6:], use_cache=False).logits
            torch.testing.assert_close(got[:, 6:], alone, atol=self.atol, rtol=self.rtol)
        elif k.op in ("rmsnorm", "swiglu"):
            torch.testing.assert_close(got, want, atol=self.atol, rtol=self.rtol)

    def test_cross_entropy_matches_torch(self):
        k = self.build()
        if k.op != "cross_entropy":
            pytest.skip(f"kernel {self.name} implements {k.op!r}, not cross_entropy")
        assert callable(getattr(k, "linear_cross_entropy_sum", None)), "a cross_entropy kernel must have linear_cross_entropy_sum"
        ok, reason = k.available()
        if not ok:
            pytest.skip(f"kernel {self.name} unavailable here: {reason}")
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        gen = torch.Generator().manual_seed(self.seed)
        n, h, v = 37, 16, 50
        hidden = torch.randn(n, h, generator=gen)
        weight = torch.randn(v, h, generator=gen) * 0.5
        bias = torch.randn(v, generator=gen) * 0.1
        labels = torch.randint(0, v, (n,), generator=gen)
        labels[::4] = -100
        results = []
        for fn in (k.linear_cross_entropy_sum, None):
            x, w, b = (t.clone().to(device).requires_grad_() for t in (hidden, weight, bias))
            y = labels.to(device)
            if fn is None:  # the plain PyTorch reference
                loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w, b).float(), y, ignore_index=-100, reduction="sum")
            else:
                loss = fn(x, w, y, ignore_index=-100, bias=b)
            assert loss.dim() == 0 and loss.dtype == torch.float32
            loss.backward()
            results.append([loss.detach(), x.grad, w.grad, b.grad])
        for what, got, want in zip(("loss", "grad hidden", "grad weight", "grad bias"), *results):
            scale = want.abs().max().clamp_min(1e-12)
            err = ((got.float() - want.float()).abs().max() / scale).item()
            assert err <= self.ce_rtol, f"{what}: max relative difference {err:.3g} > {self.ce_rtol}"


# ---- parallel strategies ---------------------------------------------------------------------


class ParallelStrategyContract(ComponentContract):
    """Contract of a parallel strategy (:class:`omnicore.components.ParallelStrategy`).

    ``single_process``: whether ``apply(model, None)`` is valid in one process without a process
    group (True for strategies with no mesh dims); then the applied model's loss must equal the
    original's. The optional members (``phase``, ``validate``, ``plan``, ``data_split``) are checked
    on planned layouts of :attr:`planned_world_sizes` ranks. Equal losses on several processes need a
    distributed test of its own (:func:`omnicore.testing.distributed.run_distributed`; see
    ``tests/test_paired_strategy.py``).
    """

    kind: ClassVar[str] = "parallel"
    single_process: ClassVar[bool | None] = None

    def test_mesh_dims_are_names(self):
        s = self.build()
        assert isinstance(s, ParallelStrategy)
        assert isinstance(s.mesh_dims, tuple) and all(isinstance(d, str) and d for d in s.mesh_dims)

    planned_world_sizes: ClassVar[tuple[int, ...]] = (1, 2, 4)
    """World sizes of the planned layouts (every rank in ``mesh``'s layout) the optional members
    are checked on; a size the strategy rejects in ``validate`` is skipped for the other checks."""
    mesh: ClassVar[dict[str, int]] = {"dp_shard": -1}
    """The ``parallel`` mesh sizes of the planned layouts (``-1``: the rest of the world)."""

    def test_optional_members_on_planned_layouts(self):
        """``phase`` is a known phase; on planned layouts (no process group, as ``omnicore plan``
        uses) ``validate`` returns Violations, ``plan`` a StrategyPlan whose shards use mesh dims
        with their planned sizes, and ``data_split`` groups of equal size that cover every rank."""
        from omnicore.components import PHASES, StrategyPlan, Violation
        from omnicore.model.omni import OmniModel
        from omnicore.parallel.mesh import FLAT_DIMS, MESH_DIMS, MeshLayout
        from omnicore.parallel.state import ParallelState

        s = self.build()
        assert getattr(s, "phase", "sharding") in PHASES, f"phase {s.phase!r} is not one of {PHASES}"
        model = OmniModel(tiny_causal_lm(self.seed), {}, {}, {"encoder": {}, "decoder": {}, "decoder_start": {}})
        for world in self.planned_world_sizes:
            layout = MeshLayout.from_config(dict({d: 1 for d in MESH_DIMS}, **self.mesh), world)
            states = [ParallelState(r, world, 0, torch.device("cpu"), None, layout) for r in range(world)]
            problems = s.validate(model, states[0]) if hasattr(s, "validate") else []
            assert isinstance(problems, list) and all(isinstance(v, (Violation, str)) for v in problems), problems
            if problems:
                continue
            if hasattr(s, "plan"):
                p = s.plan(model, states[0], {})
                assert p is None or isinstance(p, StrategyPlan)
                for pname, (dim, ways) in p.shards.items() if p else ():
                    assert dim in set(MESH_DIMS) | set(FLAT_DIMS), f"{pname}: unknown mesh dim {dim!r}"
                    assert ways == states[0].size(dim), f"{pname}: split {ways} ways over {dim!r} of size {states[0].size(dim)}"
            if hasattr(s, "data_split"):
                splits = [tuple(s.data_split(st)) for st in states]
                counts = {c for _, c in splits}
                assert len(counts) == 1, f"data_split gives different counts on a world of {world}: {splits}"
                count = counts.pop()
                assert world % count == 0 and all(0 <= i < count for i, _ in splits), splits
                sizes = [sum(1 for i, _ in splits if i == g) for g in range(count)]
                assert sizes == [world // count] * count, f"data groups of unequal size on a world of {world}: {splits}"

    def test_apply_without_mesh_keeps_the_loss(self):
        s = self.build()
        single = self.single_process if self.single_process is not None else not s.mesh_dims
        if not single:
            pytest.skip(
                f"parallel/{self.name} needs a process group (mesh_dims={s.mesh_dims}): prove N processes equal one with "
                "omnicore.testing.distributed.run_distributed, as PLUGINS.md's snippet 'N processes equal one' shows"
            )
        from omnicore.data.packing import MicroBatch
        from omnicore.model.omni import OmniModel

        model = OmniModel(tiny_causal_lm(self.seed), {}, {}, {"encoder": {}, "decoder": {}, "decoder_start": {}})
        ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
        mb = MicroBatch(ids, torch.tensor([[2, 3, 4, 5, 6, -100]]), torch.arange(6).unsqueeze(0))
        with torch.no_grad():
            want = model(mb).loss_sum
        applied = s.apply(model, None)
        assert isinstance(applied, nn.Module)
        with torch.no_grad():
            got = applied(mb).loss_sum
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        assert sum(p.numel() for p in applied.parameters()) == sum(p.numel() for p in tiny_causal_lm(self.seed).parameters())


class LoggerContract(ComponentContract):
    """Contract of a logger (:class:`omnicore.components.Logger`), run without training.

    The logger is built through the registry, started with a ``run_info`` whose ``output_dir`` is a
    fresh temporary folder, fed the rows of :attr:`rows` (training rows with ``int``, ``float``,
    ``None``, ``bool`` and a NaN value, as a skipped step has, then a validation row) and a batch of
    images, and closed. None of that may raise, and the logger must write nothing outside the
    output folder it was given (unless its options point elsewhere).

    Override :meth:`read_back` with one that reads what the logger stored (a TensorBoard event
    file, an MLflow store): the suite then checks that every finite float and int of every row came
    back, at its step and split, within ``rtol`` (TensorBoard stores float32 scalars; stored
    non-finite values are not compared), also after a resumed ``start`` (``resume=True``), which
    must keep what the earlier run logged. Without it only the calls are checked.
    """

    kind: ClassVar[str] = "logger"
    rtol: ClassVar[float] = 1e-6

    rows: ClassVar[list[tuple[int, dict[str, Any], str]]] = [
        (1, {"step": 1, "loss": 2.5, "lr": 1e-4, "targets": 40, "mfu": None, "skipped": False}, "train"),
        (2, {"step": 2, "loss": 2.25, "lr": 2e-4, "targets": 38, "mfu": None, "skipped": False}, "train"),
        (3, {"step": 3, "loss": float("nan"), "lr": 3e-4, "targets": 0, "mfu": None, "skipped": True, "skip_reason": "nonfinite"}, "train"),
        (2, {"step": 2, "loss": 2.75, "loss/text": 2.5}, "val"),
    ]
    """``(step, row, split)`` handed to ``log_metrics``, in order."""

    def run_info(self, output_dir: Any, *, resume: bool = False, start_step: int = 0) -> dict[str, Any]:
        """A ``run_info`` as the core gives it (see :meth:`omnicore.components.Logger.start`)."""
        return {
            "config": {"run": {"output_dir": str(output_dir), "seed": 0}, "train": {"max_steps": 3, "lr": 3e-4}},
            "output_dir": str(output_dir),
            "run_name": os.path.basename(str(output_dir)),
            "resume": resume,
            "start_step": start_step,
        }

    def read_back(self, output_dir: Any) -> dict[tuple[str, str], list[tuple[int, float]]] | None:
        """What the logger stored under ``output_dir``: ``{(split, key): [(step, value), ...]}``.
        None (the default) skips the value checks; override it for a logger that can be read."""
        return None

    def images(self) -> list[np.ndarray]:
        """Two 8x12 RGB ``uint8`` images (a gradient and its inverse)."""
        img = (np.arange(8 * 12 * 3).reshape(8, 12, 3) % 256).astype(np.uint8)
        return [img, 255 - img]

    def _log_all(self, out: Any, rows: list[tuple[int, dict[str, Any], str]], *, resume: bool = False) -> None:
        logger = self.build()
        logger.start(self.run_info(out, resume=resume, start_step=rows[0][0] - 1 if resume else 0))
        for step, row, split in rows:
            logger.log_metrics(step, copy.deepcopy(row), split)
        logger.log_images(rows[-1][0], "samples/image", self.images())
        logger.close()

    def _expected(self, rows: list[tuple[int, dict[str, Any], str]]) -> dict[tuple[str, str], list[tuple[int, float]]]:
        want: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for step, row, split in rows:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
                    want.setdefault((split, key), []).append((step, float(value)))
        return want

    def _check_stored(self, out: Any, rows: list[tuple[int, dict[str, Any], str]]) -> None:
        got = self.read_back(out)
        if got is None:
            pytest.skip(f"{type(self).__name__}.read_back is not overridden: nothing reads the stored values")
        for (split, key), points in self._expected(rows).items():
            # a NaN logged for a skipped step may be stored as NaN (TensorBoard shows a gap): not compared
            stored = sorted((int(s), float(v)) for s, v in got.get((split, key), []) if np.isfinite(float(v)))
            assert [s for s, _ in stored] == [s for s, _ in points], (
                f"logger {self.name}: {split} {key!r} stored at steps {[s for s, _ in stored]}, logged at {[s for s, _ in points]}"
            )
            np.testing.assert_allclose([v for _, v in stored], [v for _, v in points], rtol=self.rtol, err_msg=f"{split} {key!r}")

    def test_implements_protocol(self):
        from omnicore.components import Logger

        assert isinstance(self.build(), Logger), f"logger {self.name}: needs start, log_metrics, log_images and close"

    def test_logs_rows_and_images_without_raising(self, tmp_path):
        out = tmp_path / "run"
        before = set(os.listdir(tmp_path))
        self._log_all(out, self.rows)
        assert set(os.listdir(tmp_path)) - before <= {"run"}, f"logger {self.name} wrote outside run_info['output_dir']"

    def test_stored_values_match_logged(self, tmp_path):
        out = tmp_path / "run"
        self._log_all(out, self.rows)
        self._check_stored(out, self.rows)

    def test_resume_keeps_earlier_rows(self, tmp_path):
        out = tmp_path / "run"
        first, later = self.rows[:2], [r for r in self.rows[2:] if r[2] == "train"]
        self._log_all(out, first)
        self._log_all(out, later, resume=True)
        self._check_stored(out, first + later)

    keeps_rows_after_resume: ClassVar[str] = ""
    """Why this logger cannot drop what an interrupted run stored after the step it resumes from
    (empty: it can, and :meth:`test_resume_drops_rows_after_the_resumed_step` checks it)."""

    def test_resume_drops_rows_after_the_resumed_step(self, tmp_path):
        """A run logs steps 1-3 (and a validation row at 2) and dies; it resumes from its checkpoint
        of step 1 and logs steps 2 and 3 again, with other values: the logger then holds one row per
        step and split, the later ones (the stale validation row of step 2 is gone)."""
        if self.keeps_rows_after_resume:
            pytest.skip(f"logger {self.name}: {self.keeps_rows_after_resume}")
        out = tmp_path / "run"
        self._log_all(out, self.rows)
        again = [
            (s, {k: v * 2 if isinstance(v, float) else v for k, v in row.items()}, split)
            for s, row, split in self.rows
            if split == "train" and s > 1
        ]
        logger = self.build()
        logger.start(self.run_info(out, resume=True, start_step=1))
        for step, row, split in again:
            logger.log_metrics(step, copy.deepcopy(row), split)
        logger.close()
        self._check_stored(out, self.rows[:1] + again)
