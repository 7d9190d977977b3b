"""One parity suite for every published family: omnicore's run path against the family's transformers class.

A family's ``tests/test_model.py`` subclasses :class:`FamilyParitySuite` and states what differs::

    import omnicore_family_llava.plugin
    from omnicore.testing import FamilyParitySuite

    class TestLlavaParity(FamilyParitySuite):
        foundation = "llava"                                   # model.foundation name
        plugins = [(omnicore_family_llava.plugin, "omnicore-family-llava")]
        hf_class = "LlavaForConditionalGeneration"             # transformers class (or its name)
        samples = [
            ([{"type": "text", "text": "Say hi"}], "hi there"),
            ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "\\nWhat is it?"}], "noise"),
        ]
        media = {"a.png": (40, 52)}                            # written by write_media()

The stand-in checkpoint comes from a fixture named ``standin`` (class or session scope): the
family's ``conftest.py`` usually has one (a parametrised one runs every test once per stand-in), or
the subclass defines ``def standin(self, tmp_path_factory)``, which becomes a class-scoped fixture.

What is built, once per class and stand-in (fixture ``family_run``, :class:`FamilyRun`): the media
files of :attr:`~FamilyParitySuite.media` and a ``train.jsonl`` of the samples in a fresh folder,
the model and tokenizer from the one foundation entry through ``build_omni_model`` (an isolated
registry of :attr:`~FamilyParitySuite.plugins` plus the built-ins), and each sample encoded by the
run's ``ChatProcessor``. The reference (fixture ``hf_reference``, :class:`HFReference`) is the
transformers class read from the same folder in fp32 and its processor applied to
``apply_chat_template`` of the same conversation with the same media.

The tests, each against transformers' values (fp32, ``atol`` :attr:`~FamilyParitySuite.atol`):
    * ``test_ids_equal_transformers[sample]``: omnicore's ids are the processor's ``input_ids``;
      each medium expands to placeholder tokens (exactly :attr:`~FamilyParitySuite.media_tokens`
      of them where that is set), and the sample has 3-D positions exactly when
      :attr:`~FamilyParitySuite.mrope` says so;
    * ``test_logits_equal_transformers[sample]``: the logits of the class's forward;
    * ``test_packed_row_equals_each_sample_alone``: all samples in one packed row;
    * ``test_loss_equals_transformers_loss_on_the_assistant_tokens[sample]``: omnicore's labels are
      one contiguous span that decodes to the answer and its end of turn
      (:meth:`~FamilyParitySuite.assistant_text`), and the loss equals the class's loss with those
      labels;
    * ``test_export_is_read_back_by_from_pretrained_with_the_same_logits``: after
      :meth:`~FamilyParitySuite.perturb` moves every part, ``export_pretrained`` writes the
      stand-in's tensor names, ``from_pretrained`` reads it back to omnicore's logits on every
      sample, and the stand-in's logits differ;
    * ``test_lora_export_merged_and_adapter_equal_omnicore`` (``slow``; only with ``lora_export =
      True``): two steps of a LoRA run (:attr:`~FamilyParitySuite.lora` on the language model, the
      rest frozen) through :func:`omnicore.testing.train`; its PEFT adapter export read by
      ``PeftModel.from_pretrained`` onto the class's stand-in, and the trained model's merged
      export read back by ``from_pretrained``, give omnicore's logits of the trained model on every
      sample, which differ from the stand-in's;
    * ``test_positions_equal_get_rope_index[sample]`` (only with ``mrope = True``): the 3-D rotary
      positions are the HF model's ``get_rope_index``;
    * ``test_two_fsdp2_processes_equal_one`` (``multiprocess``, ``slow``): two training steps on 2
      FSDP2 gloo processes give one process's losses and gradient norms
      (:func:`omnicore.testing.distributed.run_distributed`).

Per-sample tests are parametrised by :attr:`~FamilyParitySuite.samples` (ids such as ``text``,
``one_image``, ``two_images``, ``one_video``); a family that takes no video lists no video sample.
An entry may be ``pytest.param(user, answer, id=..., marks=...)`` to name it or mark its per-sample
tests; a sample that cannot run here at all (a codec missing) is left out of the list, since the
packed row and the export test use every sample.

Everything heavy is in plain methods (:meth:`~FamilyParitySuite.build_run`,
:meth:`~FamilyParitySuite.build_reference`) so that a test can call a suite's test methods directly
(``tests/test_family_suite.py`` does, to show that each can fail).
"""

from __future__ import annotations

import functools
import inspect
import json
import wave
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

IGNORE = -100
"""The label of a position without a target (transformers' and omnicore's)."""

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
_DEFAULT_MEDIA: dict[str, Any] = {"image": (40, 52), "video": (8, 80, 50, 3), "audio": 8000}


@dataclass
class FamilyRun:
    """What the suite builds from the one foundation entry (fixture ``family_run``)."""

    model: Any
    """The ``OmniModel`` (CPU, fp32, eval mode)."""
    tokenizer: Any
    encoded: list[Any]
    """One :class:`omnicore.data.chat.Encoded` per sample, in the order of ``samples``."""
    data: Path
    """The folder with the media files and ``train.jsonl``."""
    registry: Any
    config: dict[str, Any]
    """The run config (as a dict) the model was built from."""
    chat: Any = None
    """The run's ``ChatProcessor`` (``chat.encode(sample, prompt_only=True)`` for a generation test)."""


@dataclass
class HFReference:
    """transformers' side (fixture ``hf_reference``): the class read from the stand-in, its processor,
    and the processor's output for each sample."""

    model: Any
    processor: Any
    inputs: list[Any] = field(default_factory=list)


def _sample_id(user: list[dict[str, Any]]) -> str:
    """``text``, ``one_image``, ``two_images``, ``one_image_one_video``, ... from the media parts."""
    counts = Counter(p["type"] for p in user if p.get("type") != "text")
    if not counts:
        return "text"
    return "_".join(f"{_WORDS.get(n, n)}_{kind}{'s' if n > 1 else ''}" for kind, n in counts.items())


def _checkpoint_keys(folder: Path) -> set[str]:
    """The tensor names of a safetensors checkpoint folder (one file or an index of shards)."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def _first_difference(got: list[int], want: list[int], tokenizer: Any) -> str:
    """Where two id lists part, with the text around that position decoded from each."""
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    lo = max(0, i - 8)
    return (
        f"lengths {len(got)} (omnicore) vs {len(want)} (transformers), first difference at {i}:\n"
        f"  omnicore:     {tokenizer.decode(got[lo : i + 8])!r}\n  transformers: {tokenizer.decode(want[lo : i + 8])!r}"
    )


def _on_instance(method: Any) -> Any:
    """``method(self, *fixtures)`` as a function of the class (for a classmethod fixture): it runs
    on a fresh instance; pytest reads the fixture names from ``method``'s signature."""

    @functools.wraps(method)
    def call(cls: type, *args: Any, **kwargs: Any) -> Any:
        return method(cls(), *args, **kwargs)

    return call


def train_metrics(config: dict[str, Any], plugins: list[tuple[str, str]]) -> list[dict[str, float]]:
    """``loss`` and ``grad_norm`` of each step of a run of ``config`` (a dict) on an isolated registry
    of ``plugins`` (``(module name, provider)`` pairs) plus the built-ins. Module level: spawned
    ranks import it by name (:func:`omnicore.testing.distributed.run_distributed`)."""
    from omnicore.config import Config
    from omnicore.testing.fakes import isolated_registry
    from omnicore.train.loop import train

    rows = train(Config.model_validate(config), registry=isolated_registry(plugins, builtins=True))
    return [{"loss": row["loss"], "grad_norm": row["grad_norm"]} for row in rows]


class FamilyParitySuite:
    """Parity tests of a published family against its transformers class; subclass it as ``Test*``.

    The base is not collected (``__test__ = False``); each subclass is, unless it sets ``__test__``
    itself (an intermediate base). Set the class attributes below; override the methods where the
    family's processor takes the conversation or media otherwise.
    """

    __test__: ClassVar[bool] = False

    # ---- what the family states ----------------------------------------------------------------

    foundation: ClassVar[str] = ""
    """The ``model.foundation`` name (``"llava"``; ``"auto"`` works where the family claims the checkpoint)."""
    foundation_options: ClassVar[dict[str, Any]] = {}
    """Foundation options besides ``checkpoint`` (the stand-in folder)."""
    plugins: ClassVar[list[Any]] = []
    """``(plugin module, provider)`` pairs for :func:`omnicore.testing.isolated_registry`."""
    hf_class: ClassVar[Any] = None
    """The transformers class that reads the stand-in and the export, or its name in ``transformers``."""
    samples: ClassVar[list[Any]] = []
    """``(user parts, answer)`` per sample (or ``pytest.param(user, answer, id=..., marks=...)``):
    user parts as omnicore's samples write them (``{"type": "text", "text": ...}``,
    ``{"type": "image" | "video" | "audio", "path": ...}``, paths relative to the data folder)."""
    media: ClassVar[dict[str, Any]] = {}
    """File name -> size of each medium that :meth:`write_media` writes: image ``(width, height)``,
    video ``(frames, width, height, fps)`` or ``(frames, width, height, fps, samples of its sound
    track)``, audio a number of samples at :attr:`audio_sampling_rate`.
    A path the samples name and this leaves out gets a default size."""
    media_tokens: ClassVar[dict[str, int]] = {}
    """Modality -> the placeholder tokens each medium expands to, where that is fixed (LLaVA's
    stand-ins: ``{"image": 16}``); checked against transformers' ids. Others are only checked to be
    at least one per medium."""
    mrope: ClassVar[bool] = False
    """True: the foundation uses multi-dimensional rotary positions; ``test_positions_equal_get_rope_index``
    runs and every sample must carry them. False: that test is left out and no sample may carry them."""
    end_of_turn: ClassVar[str | None] = None
    """The text that ends an assistant turn; None: the tokenizer's EOS token."""
    audio_sampling_rate: ClassVar[int] = 16000
    """Hz of the audio files :meth:`write_media` writes and of the clips given to the processor."""
    atol: ClassVar[float] = 1e-5
    """Absolute tolerance of every logits and loss comparison (fp32; ``rtol`` 0)."""
    perturb_scale: ClassVar[float] = 0.01
    """Standard deviation of the noise :meth:`perturb` adds to every parameter."""
    fsdp2_steps: ClassVar[int] = 2
    """Training steps of ``test_two_fsdp2_processes_equal_one`` (the second's loss follows the first's update)."""
    lora: ClassVar[dict[str, Any]] = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    """``model.lora`` of ``test_lora_export_merged_and_adapter_equal_omnicore`` (its ``export`` is set
    by the test): the adapters on the language model's layers of these names."""
    lora_lr: ClassVar[float] = 2e-2
    """``train.lr`` of that test's two steps: large enough that the adapters move the logits."""
    lora_export: ClassVar[bool] = False
    """True: ``test_lora_export_merged_and_adapter_equal_omnicore`` runs (a 2-step run and two exports,
    4 to 9 s a class on 2 busy cores); False: it is left out, not skipped. On for LLaVA's plugin and
    the generic family's FSDP2 types (the family-kit's ``test_matrix.py``)."""
    lora_merge_atol: ClassVar[float] = 1e-4
    """Absolute tolerance between the trained model with its adapters apart (``W x + s B A x``) and
    merged (``(W + s B A) x``): fp32 rounds the two differently (1.4e-5 measured on Qwen2-VL's
    stand-in, logits up to 7, at any learning rate). The merged export itself is compared with
    omnicore's merged model at :attr:`atol`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__test__" not in cls.__dict__:
            cls.__test__ = True
        name = "test_positions_equal_get_rope_index"
        if name not in cls.__dict__:  # without mRoPE the test is left out, not skipped
            setattr(cls, name, FamilyParitySuite.__dict__[name] if cls.mrope else None)
        name = "test_lora_export_merged_and_adapter_equal_omnicore"
        if name not in cls.__dict__:  # a run and two exports: only where lora_export asks for them
            setattr(cls, name, FamilyParitySuite.__dict__[name] if cls.lora_export else None)
        standin = cls.__dict__.get("standin")
        if inspect.isfunction(standin):  # the plain-method form of the hook: a class-scoped fixture
            cls.standin = pytest.fixture(scope="class", name="standin")(classmethod(_on_instance(standin)))

    # ---- collection ----------------------------------------------------------------------------

    def _check_class(self) -> None:
        """Raises TypeError naming the class attribute a subclass left unset or gave the wrong shape."""
        where = type(self).__qualname__
        for attr in ("foundation", "plugins", "hf_class", "samples"):
            if not getattr(self, attr):
                raise TypeError(f"{where}: set the class attribute {attr!r} (see omnicore.testing.family)")
        for k, (user, answer, _, _) in enumerate(self.sample_list()):
            if not isinstance(user, list) or not isinstance(answer, str):
                raise TypeError(f"{where}.samples[{k}]: give (user parts: list of dicts, answer: str)")
            bad = [
                p for p in user if p.get("type") not in ("text", "image", "video", "audio") or ("path" not in p) == (p["type"] != "text")
            ]
            if bad:
                raise TypeError(f"{where}.samples[{k}]: parts must be text (with 'text') or image/video/audio (with 'path'): {bad}")

    def sample_list(self) -> list[tuple[list[dict[str, Any]], str, str, tuple[Any, ...]]]:
        """``(user parts, answer, id, marks)`` of each entry of :attr:`samples`."""
        out = []
        for entry in self.samples:
            if hasattr(entry, "values") and hasattr(entry, "marks"):  # pytest.param(...)
                user, answer = entry.values
                out.append((user, answer, entry.id or _sample_id(user), tuple(entry.marks)))
            else:
                user, answer = entry
                out.append((user, answer, _sample_id(user), ()))
        return out

    def pytest_generate_tests(self, metafunc: Any) -> None:
        """Parametrise every test that takes ``sample`` by the index of each sample."""
        self._check_class()
        if "sample" in metafunc.fixturenames:
            params = [pytest.param(k, id=sid, marks=marks) for k, (_, _, sid, marks) in enumerate(self.sample_list())]
            metafunc.parametrize("sample", params)

    # ---- hooks ---------------------------------------------------------------------------------

    def media_counts(self, user: list[dict[str, Any]]) -> Counter[str]:
        """Modality -> how many media of the sample's parts expand to that modality's placeholder
        tokens (``test_ids_equal_transformers`` checks the tokens against it); default: the parts of
        each kind. Override where one part expands to more (a clip whose sound track is read as audio)."""
        return Counter(p["type"] for p in user if p["type"] != "text")

    def write_media(self, folder: Path) -> None:
        """Write every medium the samples name under ``folder``: images as seeded noise (any format
        PIL writes from the suffix), clips as lossless FFV1 in Matroska (needs PyAV; a sound track, where
        the size gives one, as lossless float PCM of seeded noise), audio as 16-bit mono WAV of seeded
        noise (amplitude 0.2). Sizes from :attr:`media`."""
        kinds: dict[str, str] = {}
        for user, _, _, _ in self.sample_list():
            for p in user:
                if p["type"] != "text":
                    kinds.setdefault(p["path"], p["type"])
        order = [p for p in self.media if p in kinds] + [p for p in kinds if p not in self.media]
        for seed, path in enumerate(order):
            kind, size = kinds[path], self.media.get(path, _DEFAULT_MEDIA[kinds[path]])
            rng = np.random.default_rng(seed)
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if kind == "image":
                from PIL import Image

                width, height = size
                Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(target)
            elif kind == "video":
                n, width, height, fps, *sound = size
                frames = rng.integers(0, 256, (n, height, width, 3), dtype=np.uint8)
                track = (0.2 * rng.standard_normal(int(sound[0]))).clip(-1, 1) if sound else None
                _write_video(target, frames, fps, track, self.audio_sampling_rate)
            else:
                samples = (0.2 * rng.standard_normal(int(size))).clip(-1, 1)
                with wave.open(str(target), "wb") as w:
                    w.setnchannels(1)
                    w.setsampwidth(2)
                    w.setframerate(self.audio_sampling_rate)
                    w.writeframes((samples * 32767).astype("<i2").tobytes())

    def config(self, standin: Path, data: Path) -> dict[str, Any]:
        """The run config (a dict) the model is built from: the one foundation entry on ``standin``
        and ``data/train.jsonl``. Extend it for a family that needs more (a decoder, data options)."""
        options = {**self.foundation_options, "checkpoint": str(standin)}
        return {
            "run": {"output_dir": str(data / "run"), "seed": 0},
            "model": {"foundation": {"name": self.foundation, "options": options}},
            "data": {"train": str(data / "train.jsonl")},
        }

    def lora_config(self, standin: Path, run: FamilyRun, out: Path, export: str) -> dict[str, Any]:
        """The run config of ``test_lora_export_merged_and_adapter_equal_omnicore``: :meth:`config`
        plus :attr:`lora` (``export`` as given) into ``out``, two steps at :attr:`lora_lr` with no
        warm-up, data read in the training process, and every part outside the language model
        frozen, so that only the adapters train (the base stays the stand-in's)."""
        cfg = self.config(standin, run.data)
        outside = sorted({".".join(n.split(".")[:2]) for n, _ in run.model.named_parameters() if not n.startswith("lm.")})
        cfg["run"] = {**cfg["run"], "output_dir": str(out), "seed": 0}
        cfg["model"] = {**cfg["model"], "lora": {**self.lora, "export": export}}
        cfg["data"] = {**cfg["data"], "num_workers": 0, "max_tokens": max(1024, max(len(e) for e in run.encoded))}
        steps = {"max_steps": 2, "lr": self.lora_lr, "warmup_steps": 0, "freeze": outside}
        cfg["train"] = {**cfg.get("train", {}), **steps, "progress": False, "export": True}
        return cfg

    def hf_model_class(self) -> Any:
        """:attr:`hf_class` as a class (a name is looked up in ``transformers``)."""
        if not isinstance(self.hf_class, str):
            return self.hf_class
        import transformers

        try:
            return getattr(transformers, self.hf_class)
        except AttributeError:
            raise TypeError(f"{type(self).__qualname__}.hf_class: transformers has no {self.hf_class!r}") from None

    def load_hf_processor(self, folder: Path) -> Any:
        """transformers' processor of a checkpoint folder (the stand-in, then the export); default
        ``AutoProcessor.from_pretrained``."""
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)

    def hf_messages(self, user: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
        """The conversation as the processor's chat template takes it; default: the parts in order,
        each medium as ``{"type": kind}``. Override where the template renders media or text otherwise."""
        content = [p if p["type"] == "text" else {"type": p["type"]} for p in user]
        return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]

    def hf_media(self, data: Path, user: list[dict[str, Any]]) -> dict[str, Any]:
        """The processor's media arguments for the sample's parts, in order: ``images`` (PIL),
        ``videos`` (frame arrays ``[T, H, W, 3]``) with ``video_metadata`` (frames and fps), and
        ``audio`` (float samples) with ``sampling_rate``; a kind the sample lacks is left out."""
        from omnicore.data.media import load_audio, load_image, load_video

        out: dict[str, Any] = {}
        images = [load_image(data / p["path"]) for p in user if p["type"] == "image"]
        clips = [load_video(data / p["path"]) for p in user if p["type"] == "video"]
        audio = [load_audio(data / p["path"]) for p in user if p["type"] == "audio"]
        if images:
            out["images"] = images
        if clips:
            out["videos"] = [c.frames for c in clips]
            out["video_metadata"] = [{"total_num_frames": len(c.frames), "fps": float(c.fps)} for c in clips]
        if audio:
            out["audio"] = [a.samples for a in audio]
            out["sampling_rate"] = self.audio_sampling_rate
        return out

    def hf_inputs(self, processor: Any, data: Path, user: list[dict[str, Any]], answer: str, *, prompt_only: bool = False) -> Any:
        """The processor applied to ``apply_chat_template`` of :meth:`hf_messages` with :meth:`hf_media`;
        ``prompt_only``: without the assistant's turn and with the generation prompt (a generation test's)."""
        messages = self.hf_messages(user, answer)
        messages = messages[:-1] if prompt_only else messages
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt_only)
        return processor(text=text, return_tensors="pt", **self.hf_media(data, user))

    def assistant_text(self, answer: str, tokenizer: Any) -> str:
        """What the supervised tokens decode to: the answer and :attr:`end_of_turn` (default the EOS token)."""
        return answer + (self.end_of_turn if self.end_of_turn is not None else tokenizer.eos_token)

    def perturb(self, model: Any) -> None:
        """ "Train" the model before the export test: add seeded noise (std :attr:`perturb_scale`) to
        every parameter, so every exported tensor differs from the stand-in's. Runs under no_grad."""
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(self.perturb_scale * torch.randn(p.shape, generator=g).to(p.dtype))

    def hf_positions(self, hf_model: Any, inputs: Any) -> torch.Tensor:
        """The HF model's 3-D rotary positions ``[3, T]`` of one sample: ``model.get_rope_index``
        given the input ids and every argument of its signature that the processor's output holds."""
        fn = hf_model.model.get_rope_index
        names = [n for n in inspect.signature(fn).parameters if n != "input_ids" and n in inputs]
        positions, _ = fn(inputs["input_ids"], **{n: inputs[n] for n in names})
        return positions[:, 0]

    # ---- what the suite builds -----------------------------------------------------------------

    def build_run(self, standin: Path, folder: Path) -> FamilyRun:
        """Write the media and ``train.jsonl`` under ``folder``, build the model from
        :meth:`config` and encode every sample (see :class:`FamilyRun`)."""
        from omnicore.config import Config
        from omnicore.data.chat import ChatProcessor
        from omnicore.data.jsonl import read_jsonl
        from omnicore.model.build import build_omni_model
        from omnicore.testing.fakes import isolated_registry

        self._check_class()
        folder.mkdir(parents=True, exist_ok=True)
        self.write_media(folder)
        with open(folder / "train.jsonl", "w") as f:
            for user, answer, _, _ in self.sample_list():
                f.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
        registry = isolated_registry(self.plugins, builtins=True)
        config = self.config(Path(standin), folder)
        cfg = Config.model_validate(config)
        torch.manual_seed(0)
        model, tok = build_omni_model(cfg, registry)
        model.eval()
        proc = ChatProcessor.for_model(tok, model, cfg.data)
        encoded = [proc.encode(s) for s in read_jsonl(folder / "train.jsonl")]
        return FamilyRun(model, tok, encoded, folder, registry, config, proc)

    def build_reference(self, standin: Path, data: Path) -> HFReference:
        """The transformers class and processor of ``standin``, and the processor's output per sample."""
        model = self.hf_model_class().from_pretrained(standin, dtype=torch.float32).eval()
        processor = self.load_hf_processor(standin)
        inputs = [self.hf_inputs(processor, data, user, answer) for user, answer, _, _ in self.sample_list()]
        return HFReference(model, processor, inputs)

    @staticmethod
    def logits(model: Any, encoded: list[Any]) -> Any:
        """omnicore's forward (no grad) of ``encoded`` packed into one row: ``.logits [1, T, V]``,
        ``.loss_sum``, ``.n_targets``."""
        from omnicore.data.packing import collate

        mb = collate(encoded, model.encoder_processors(), {})
        with torch.no_grad():
            return model(mb, return_logits=True)

    @pytest.fixture(autouse=True)
    def _family_one_thread(self):
        """One intra-op thread: tiny models gain nothing from more, and a busy machine makes OpenMP spin."""
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(old)

    @pytest.fixture(scope="class")
    @classmethod
    def family_run(cls, standin, tmp_path_factory) -> FamilyRun:
        """:meth:`build_run` on the stand-in, once per class and stand-in."""
        return cls().build_run(Path(standin), tmp_path_factory.mktemp(f"{cls.foundation}_parity"))

    @pytest.fixture(scope="class")
    @classmethod
    def hf_reference(cls, standin, family_run) -> HFReference:
        """:meth:`build_reference` on the stand-in, once per class and stand-in."""
        return cls().build_reference(Path(standin), family_run.data)

    # ---- the tests -----------------------------------------------------------------------------

    def test_ids_equal_transformers(self, family_run: FamilyRun, hf_reference: HFReference, sample: int) -> None:
        """omnicore's ids are the HF processor's; each medium expands to placeholder tokens."""
        enc, inputs = family_run.encoded[sample], hf_reference.inputs[sample]
        want = inputs["input_ids"][0].tolist()
        assert enc.input_ids == want, _first_difference(enc.input_ids, want, family_run.tokenizer)
        counts = self.media_counts(self.sample_list()[sample][0])
        config = hf_reference.model.config
        for kind in ("image", "video", "audio"):
            token = getattr(config, f"{kind}_token_id", None)
            if token is None:
                continue
            got = want.count(token)
            if kind in self.media_tokens:
                assert got == counts[kind] * self.media_tokens[kind], f"{got} {kind} tokens for {counts[kind]} {kind}(s)"
            else:
                assert (got >= counts[kind]) and (got == 0) == (counts[kind] == 0), f"{got} {kind} tokens for {counts[kind]} {kind}(s)"
        has_positions = enc.rope_position_ids is not None
        assert has_positions == self.mrope, (
            f"the sample {'carries' if has_positions else 'lacks'} 3-D rotary positions: set mrope = {has_positions} on {type(self).__qualname__}"
        )

    def test_logits_equal_transformers(self, family_run: FamilyRun, hf_reference: HFReference, sample: int) -> None:
        """The logits of one sample equal the HF class's forward on the processor's output."""
        with torch.no_grad():
            want = hf_reference.model(**hf_reference.inputs[sample]).logits[0]
        got = self.logits(family_run.model, [family_run.encoded[sample]]).logits[0]
        torch.testing.assert_close(got, want, atol=self.atol, rtol=0)

    def test_packed_row_equals_each_sample_alone(self, family_run: FamilyRun) -> None:
        """All samples packed into one row give each sample's logits alone, in order."""
        encoded = family_run.encoded
        packed = self.logits(family_run.model, encoded).logits[0]
        start = 0
        for k, e in enumerate(encoded):
            alone = self.logits(family_run.model, [e]).logits[0]
            torch.testing.assert_close(packed[start : start + len(e)], alone, atol=self.atol, rtol=0, msg=lambda m, k=k: f"sample {k}: {m}")
            start += len(e)
        assert start == packed.shape[0]

    def test_loss_equals_transformers_loss_on_the_assistant_tokens(
        self, family_run: FamilyRun, hf_reference: HFReference, sample: int
    ) -> None:
        """omnicore's targets are the answer and its end of turn, and its loss is the HF class's loss
        with those labels."""
        enc, tok = family_run.encoded[sample], family_run.tokenizer
        ids = enc.input_ids
        assert enc.labels[-1] == IGNORE, "the last position has a target (there is no next token)"
        labels = [IGNORE] + enc.labels[:-1]  # omnicore's label i is token i + 1's; transformers shifts itself
        span = [i for i, label in enumerate(labels) if label != IGNORE]
        assert span, "no supervised token"
        start, end = span[0], span[-1] + 1
        assert span == list(range(start, end)), f"the targets are not one span: positions {span}"
        assert labels[start:end] == ids[start:end], "a target is not the next token"
        answer = self.sample_list()[sample][1]
        got_text = tok.decode(ids[start:end], skip_special_tokens=False)
        assert got_text == self.assistant_text(answer, tok), f"the targets decode to {got_text!r}"
        out = self.logits(family_run.model, [enc])
        assert int(out.n_targets) == end - start
        with torch.no_grad():
            want = hf_reference.model(**hf_reference.inputs[sample], labels=torch.tensor([labels])).loss
        torch.testing.assert_close(out.loss_sum / out.n_targets, want, atol=self.atol, rtol=0)

    def test_positions_equal_get_rope_index(self, family_run: FamilyRun, hf_reference: HFReference, sample: int) -> None:
        """The data side's 3-D rotary positions are the HF model's ``get_rope_index`` (``mrope`` only)."""
        want = self.hf_positions(hf_reference.model, hf_reference.inputs[sample])
        assert family_run.encoded[sample].rope_position_ids == want.tolist()

    def test_export_is_read_back_by_from_pretrained_with_the_same_logits(
        self, family_run: FamilyRun, hf_reference: HFReference, tmp_path: Path
    ) -> None:
        """The perturbed model's export has the stand-in's tensor names and is read back by the HF
        class to omnicore's logits on every sample; the stand-in's logits differ."""
        from omnicore.model.trainable import match_depth

        run, model = family_run, family_run.model
        options = run.config["model"]["foundation"]["options"]
        standin = Path(options["checkpoint"])
        foundation = run.registry.build("foundation", self.foundation, dict(options))
        state = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            with torch.no_grad():
                self.perturb(model)
            moved = [n for n, p in model.named_parameters() if not torch.equal(p, state[n])]
            parts = model.part_names or {"lm": ["lm"], **{f"encoders.{m}": [f"encoders.{m}"] for m in model.encoders}}
            still = [part for part, prefixes in parts.items() if not any(match_depth(n, q) for n in moved for q in prefixes)]
            assert not still, f"perturb() moved no parameter of the parts {still}"
            out = tmp_path / "hf"
            foundation.export_pretrained(model, run.tokenizer, out)
            assert _checkpoint_keys(out) == _checkpoint_keys(standin), "the export's tensor names differ from the stand-in's"
            back = self.hf_model_class().from_pretrained(out, dtype=torch.float32).eval()
            assert type(back) is type(hf_reference.model)
            processor = self.load_hf_processor(out)
            for k, (user, answer, sid, _) in enumerate(self.sample_list()):
                inputs = self.hf_inputs(processor, run.data, user, answer)
                assert inputs["input_ids"][0].tolist() == run.encoded[k].input_ids, f"{sid}: the exported processor gives other ids"
                with torch.no_grad():
                    want = back(**inputs).logits[0]
                    before = hf_reference.model(**hf_reference.inputs[k]).logits[0]
                got = self.logits(model, [run.encoded[k]]).logits[0]
                torch.testing.assert_close(got, want, atol=self.atol, rtol=0, msg=lambda m, sid=sid: f"{sid}: {m}")
                assert not torch.allclose(before, want, atol=1e-3), f"{sid}: the export gives the stand-in's logits"
        finally:
            model.load_state_dict(state)

    @pytest.mark.slow
    def test_lora_export_merged_and_adapter_equal_omnicore(self, family_run: FamilyRun, hf_reference: HFReference, tmp_path: Path) -> None:
        """Two LoRA steps through the run path (:meth:`lora_config`, ``export: adapter``), then the
        trained model (the run's last checkpoint, adapters applied) exported ``merged`` by the core's
        ``export_model`` (``lora_export`` only). On every sample: the run's PEFT adapter
        (``export/foundation_lora``), read by ``PeftModel.from_pretrained`` onto the class's stand-in,
        gives the trained model's logits; the merged export, read back by the HF class, gives the
        logits of the trained model with its adapters merged, and those of the trained model within
        :attr:`lora_merge_atol`; the stand-in's logits differ."""
        import copy

        from peft import PeftModel

        from omnicore.checkpoint.dcp import latest_checkpoint, load_checkpoint
        from omnicore.checkpoint.export import export_model
        from omnicore.config import Config
        from omnicore.model.lora import apply_lora, merge_lora
        from omnicore.parallel.state import ParallelState
        from omnicore.testing import train

        run = family_run
        standin = Path(run.config["model"]["foundation"]["options"]["checkpoint"])
        cfg = Config.model_validate(self.lora_config(standin, run, tmp_path / "run", "adapter"))
        assert len(train(cfg, registry=run.registry)) == 2
        one = ParallelState(0, 1, 0, torch.device("cpu"))
        model = copy.deepcopy(run.model)  # the suite's model with the run's adapters, filled from its last checkpoint
        apply_lora(model, cfg.model.lora)
        load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"), model, None, None, one)
        model.eval()
        got = [self.logits(model, [e]).logits[0] for e in run.encoded]
        folded = copy.deepcopy(model)
        merge_lora(folded)
        got_merged = [self.logits(folded, [e]).logits[0] for e in run.encoded]
        merged = cfg.model_copy(deep=True)
        merged.model.lora.export = "merged"
        export_model(model, run.tokenizer, merged, tmp_path / "merged", one, run.registry)
        back = self.hf_model_class().from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
        assert type(back) is type(hf_reference.model)
        processor = self.load_hf_processor(tmp_path / "merged")
        adapter = tmp_path / "run" / "export" / "foundation_lora"
        assert (adapter / "adapter_model.safetensors").is_file(), f"the run's adapter export wrote no {adapter}"
        base = self.hf_model_class().from_pretrained(standin, dtype=torch.float32)
        peft = PeftModel.from_pretrained(base, adapter).eval()
        for k, (user, answer, sid, _) in enumerate(self.sample_list()):
            inputs = self.hf_inputs(processor, run.data, user, answer)
            assert inputs["input_ids"][0].tolist() == run.encoded[k].input_ids, f"{sid}: the merged export's processor gives other ids"
            with torch.no_grad():
                from_merged = back(**inputs).logits[0]
                from_adapter = peft(**hf_reference.inputs[k]).logits[0]
                before = hf_reference.model(**hf_reference.inputs[k]).logits[0]
            torch.testing.assert_close(got[k], from_adapter, atol=self.atol, rtol=0, msg=lambda m, sid=sid: f"{sid}, adapter: {m}")
            torch.testing.assert_close(got_merged[k], from_merged, atol=self.atol, rtol=0, msg=lambda m, sid=sid: f"{sid}, merged: {m}")
            torch.testing.assert_close(got[k], from_merged, atol=self.lora_merge_atol, rtol=0, msg=lambda m, sid=sid: f"{sid}, merged: {m}")
            assert not torch.allclose(before, got[k], atol=1e-3), f"{sid}: the LoRA steps left the stand-in's logits"

    @pytest.mark.slow
    @pytest.mark.multiprocess
    def test_two_fsdp2_processes_equal_one(self, family_run: FamilyRun, tmp_path: Path) -> None:
        """:attr:`fsdp2_steps` steps on 2 FSDP2 gloo processes (one micro-batch each) give the losses
        and gradient norms of one process with ``grad_accum: 2`` on the same samples."""
        from omnicore.testing.distributed import max_rel_diff, run_distributed

        rows = [json.loads(line) for line in (family_run.data / "train.jsonl").read_text().splitlines()]
        data = family_run.data / "fsdp2.jsonl"  # beside the media: the samples' paths are relative to it
        data.write_text("".join(json.dumps(r) + "\n" for r in rows * max(1, -(-12 // len(rows)))))
        longest = max(len(e) for e in family_run.encoded)
        plugins = [(getattr(p, "__name__", p), provider) for p, provider in self.plugins]

        def config(out: str, grad_accum: int) -> dict[str, Any]:
            cfg = self.config(Path(family_run.config["model"]["foundation"]["options"]["checkpoint"]), family_run.data)
            cfg["run"] = {**cfg["run"], "output_dir": str(tmp_path / out), "seed": 0}
            # data read in the training process: workers forked from this one, which has decoded
            # clips already (PyAV's threads), can hang
            cfg["data"] = {**cfg["data"], "train": str(data), "max_tokens": max(256, longest), "num_workers": 0}
            steps = {"max_steps": self.fsdp2_steps, "grad_accum": grad_accum, "lr": 1e-2, "warmup_steps": 0}
            cfg["train"] = {**cfg.get("train", {}), **steps, "progress": False, "export": False}
            cfg["parallel"] = {"strategies": ["fsdp2"], "backend": "gloo"}
            return cfg

        one = train_metrics(config("one", 2), plugins)
        two = run_distributed(train_metrics, 2, args=(config("two", 1), plugins), timeout=600)
        assert len(one) == self.fsdp2_steps
        assert two[0] == two[1]
        assert max_rel_diff(two[0], one) <= 1e-5, (one, two[0])


def _write_video(path: Path, frames: np.ndarray, fps: int, sound: np.ndarray | None = None, rate: int = 16000) -> None:
    """RGB frames ``[T, H, W, 3]`` (uint8) as lossless FFV1 in Matroska at ``fps`` (needs PyAV), with
    ``sound`` (mono samples in [-1, 1] at ``rate`` Hz) as a float PCM track where given."""
    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0"
        track = container.add_stream("pcm_f32le", rate=rate) if sound is not None else None
        if track is not None:
            track.layout = "mono"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
        if track is not None:
            chunk = av.AudioFrame.from_ndarray(sound.astype(np.float32).reshape(1, -1), format="flt", layout="mono")
            chunk.sample_rate, chunk.pts = rate, 0
            container.mux(track.encode(chunk))
            container.mux(track.encode())
