"""The run config: one YAML file validated by pydantic, with dotted command-line overrides.

Every model is strict (unknown keys are errors) and every field is documented here, next to what it
configures. Errors name the file, the dotted key and, for a misspelt key, the closest valid one::

    examples/digits/config.yaml: train.max_step: unknown key; did you mean 'max_steps'?

Overrides use dotted keys, as in ``omnicore train CONFIG --train.max_steps 50``; the value is parsed
as YAML (``50`` is an int, ``true`` a bool, ``[1, 2]`` a list). A mapping merges into the file's
(``--model.decoders '{}'`` changes nothing); ``null`` removes the key, so it takes its default
(``--model.decoders null`` trains without decoders, ``--data.eval null`` without held-out data).
Numbers follow YAML 1.2 in files and overrides alike (``1e-6`` is a float, see :func:`yaml_load`).
"""

from __future__ import annotations

import difflib
import functools
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError


class ConfigError(Exception):
    """The config file or an override is invalid; the message names the file and the key."""


class _Strict(BaseModel):
    # allow_inf_nan=False: a NaN or inf in any float field (train.lr: .inf) is a config error naming
    # the field; accepted, it would turn every weight into NaN at the first step
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)


class NoOptions(_Strict):
    """The options model of a component that takes no options: any key is an error that names it
    (instead of being silently ignored)."""


class ComponentConfig(_Strict):
    """One component chosen from the registry."""

    name: str = Field(description="registry name, or 'provider:name' to pick one provider when several offer it")
    options: dict[str, Any] = Field(default_factory=dict, description="the component's own options, validated by its options model")
    dtype: Literal["float32", "bfloat16"] | None = Field(
        default=None,
        description="dtype of this component's parameters, applied as it is built or loaded (a checkpoint's tensors are cast while "
        "read); unset: run.dtype",
    )
    share: str | None = Field(
        default=None,
        description="encoders only: the key of another encoder whose module encodes this modality too (as Qwen2-VL's one vision "
        "tower encodes images and video); this entry then builds only its processor, and that module must list this modality",
    )

    @field_validator("options")
    @classmethod
    def _finite_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        where = nonfinite_at(options)
        if where is not None:
            key, value = where
            raise PydanticCustomError(
                "finite_option", "{key}: {value} is not a finite number; give a finite value", {"key": key, "value": value}
            )
        return options


def nonfinite_at(tree: Any, prefix: str = "") -> tuple[str, float] | None:
    """The dotted key (``config.rms_norm_eps``, ``sizes[1]``) and value of the first NaN or inf float
    in ``tree`` (nested dicts and lists, as a component's free-form ``options`` hold them), or None.
    Typed float fields refuse them through pydantic (``allow_inf_nan=False``); this covers the
    untyped ones, such as a foundation's ``config`` passed on to transformers."""
    if isinstance(tree, float) and not math.isfinite(tree):
        return prefix, tree
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for k, v in items:
        key = f"{prefix}[{k}]" if isinstance(k, int) else f"{prefix}.{k}" if prefix else str(k)
        found = nonfinite_at(v, key)
        if found is not None:
            return found
    return None


KERNEL_OPS: tuple[str, ...] = ("attention", "rmsnorm", "swiglu", "cross_entropy")
"""The ops a kernel can implement (``Kernel.op``), the keys of ``model.kernels``."""

DEFAULT_ATTENTION = "sdpa"
"""The attention kernel when ``model.kernels.attention`` is unset."""

REMOVED_KEYS: dict[str, str] = {
    "model.attention": "model.kernels.attention",
    "parallel.strategy": "parallel.strategies (a list, e.g. [fsdp2])",
    "train.activation_checkpointing": "parallel.strategies: add {name: activation_checkpointing, options: {mode: full|selective|op}}",
    "train.ac_every": "parallel.strategies: {name: activation_checkpointing, options: {mode: selective, every: N}}",
    "train.compile": "parallel.strategies: add compile (or {name: compile, options: {backend: inductor}})",
    "train.compile_backend": "parallel.strategies: {name: compile, options: {backend: ...}}",
}
"""Keys that said something another key also says, each with the one spelling to use now."""

MOVED_KEYS: dict[str, dict[str, str]] = {
    "train": {
        "eval_every": "eval.every",
        "eval_max_samples": "eval.max_samples",
        "eval_task_samples": "eval.task_samples",
        "sample_every": "samples.every",
        "sample_prompts": "samples.prompts",
    },
}
"""Keys that moved to another section: section -> old key -> new dotted spelling. An old key in its
old place is an error that names the new spelling (:func:`_refuse_moved_keys`), never silently
accepted or dropped."""


def _refuse_moved_keys(section: str, raw: Any) -> Any:
    """A ``mode="before"`` model check: ``raw`` (the section as given) must hold no key of
    :data:`MOVED_KEYS` for ``section``.

    Raises:
        PydanticCustomError: ``moved_key``, its context ``moved`` the ``(old dotted key, new dotted
            key)`` pairs found (:func:`format_errors` prints one line per pair, naming the old key).
    """
    moved = [(f"{section}.{k}", new) for k, new in MOVED_KEYS.get(section, {}).items() if isinstance(raw, dict) and k in raw]
    if moved:
        raise PydanticCustomError("moved_key", "{text}", {"moved": moved, "text": "; ".join(f"{old} moved to {new}" for old, new in moved)})
    return raw


class LoraConfig(_Strict):
    """LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") through
    PEFT on the ``nn.Linear`` layers named by ``target_modules`` under the ``modules`` prefixes
    (:func:`omnicore.model.lora.apply_lora`). Inside those prefixes only the adapters train."""

    r: int = Field(default=8, gt=0, description="rank of the low-rank update")
    alpha: float = Field(default=16.0, gt=0, description="scaling numerator: the update is scaled by alpha / r")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="nn.Linear module names (PEFT's target_modules: a name matches a module whose dotted name ends with it); "
        "each must match at least one nn.Linear under every prefix of modules",
    )
    modules: list[str] = Field(
        default_factory=lambda: ["lm"],
        min_length=1,
        description="OmniModel submodule prefixes to adapt, e.g. lm (the foundation) or encoders.image; everything else in them "
        "is frozen, parts outside them train as usual",
    )
    export: Literal["merged", "adapter"] = Field(
        default="merged",
        description="merged: export with the adapters folded in (loads in plain transformers); adapter: the base foundation "
        "folder plus a PEFT adapter folder export/foundation_lora (adapters outside the foundation are merged)",
    )


def check_shares(m: Any) -> None:
    """``share`` is set only on encoders, and names another encoder that has its own module.

    Raises:
        ValueError: naming the field (``model.encoders.video.share``) and what to write.
    """
    for field_name, c in [("model.foundation", m.foundation)] + [(f"model.decoders.{k}", c) for k, c in m.decoders.items()]:
        if c.share is not None:
            raise ValueError(f"{field_name}.share: only encoders share a module; remove it")
    for key, c in m.encoders.items():
        if c.share is None:
            continue
        other = m.encoders.get(c.share)
        if c.share == key or other is None:
            have = ", ".join(k for k in m.encoders if k != key) or "none"
            raise ValueError(f"model.encoders.{key}.share: {c.share!r} is not another encoder key (encoders: {have})")
        if other.share is not None:
            raise ValueError(f"model.encoders.{key}.share: {c.share!r} shares {other.share!r} itself; share {other.share!r} directly")


class ModelConfig(_Strict):
    foundation: ComponentConfig = Field(
        default_factory=lambda: ComponentConfig(name="hf_causal_lm"), description="the language model at the centre"
    )
    encoders: dict[str, ComponentConfig] = Field(
        default_factory=dict, description="input-side encoders keyed by modality (image, audio, ...)"
    )
    decoders: dict[str, ComponentConfig] = Field(default_factory=dict, description="output-side decoders keyed by modality (image, ...)")
    kernels: dict[str, str | ComponentConfig] = Field(
        default_factory=dict,
        description="kernel per op: op -> registry kernel name (or {name, options}); ops: attention, rmsnorm, swiglu, cross_entropy. "
        "Unset ops: sdpa attention, torch_cross_entropy, and the foundation's own rmsnorm and swiglu code",
    )
    lora: LoraConfig | None = Field(default=None, description="LoRA adapters (PEFT); unset: no adapters")
    init_from: str | None = Field(
        default=None,
        description="start from the weights of a previous run (a training stage): its run folder (its export/, else its newest "
        "checkpoint that verifies), its export folder or one of its checkpoints/step-NNNNNNNN (e.g. step-00000400); weights only: a new optimizer, LR schedule "
        "and data position; ignored by --resume (which continues this run). Configure the same components as that run. Relative "
        "to the config file (see omnicore.checkpoint.init_from)",
    )

    _brought: set[str] = PrivateAttr(default_factory=set)
    """Encoder keys added by the foundation (``Foundation.encoders()``), not written by the user:
    an export leaves them out, since the foundation brings them again."""

    @model_validator(mode="after")
    def _shares(self) -> ModelConfig:
        check_shares(self)
        return self

    @field_validator("kernels")
    @classmethod
    def _known_ops(cls, kernels: dict[str, str | ComponentConfig]) -> dict[str, str | ComponentConfig]:
        for op in kernels:
            if op not in KERNEL_OPS:
                close = difflib.get_close_matches(op, KERNEL_OPS, n=1, cutoff=0.5)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise PydanticCustomError(
                    "kernel_op",
                    "model.kernels.{op}: unknown op; {hint}valid ops: {ops}",
                    {"op": op, "hint": hint, "ops": ", ".join(KERNEL_OPS)},
                )
        return kernels

    def kernel_choices(self) -> dict[str, ComponentConfig]:
        """The configured kernel of each op: ``attention`` always (``sdpa`` unless
        ``model.kernels.attention`` names one), the other ops only where ``model.kernels`` names one."""
        out = {"attention": ComponentConfig(name=DEFAULT_ATTENTION)}
        for op, c in self.kernels.items():
            out[op] = c if isinstance(c, ComponentConfig) else ComponentConfig(name=c)
        return out


SOURCE_COLUMNS: tuple[str, ...] = ("messages", "image", "audio", "prompt", "response")
"""The keys of ``SourceConfig.columns``: what a table column means in a chat sample."""


class SourceConfig(_Strict):
    """One training data source: JSONL shards (``path``) or a table read through Hugging Face
    ``datasets`` (``dataset``). Read by :func:`omnicore.data.sources.open_source`."""

    name: str | None = Field(
        default=None, description="name in metrics and messages; default: the file stem, folder or dataset name (must be unique per run)"
    )
    path: str | None = Field(
        default=None,
        description="chat JSONL: a file, a glob (shards/*.jsonl, ** allowed) or a folder (every *.jsonl in it, sorted); relative to "
        "the config file",
    )
    dataset: str | None = Field(
        default=None,
        description="a table read through Hugging Face datasets: a local Parquet/Arrow/JSONL/JSON file, glob or folder (relative to "
        "the config file), or a dataset name already in the local HF cache (never downloaded)",
    )
    format: Literal["auto", "jsonl", "parquet", "arrow", "json"] = Field(
        default="auto", description="file format of a local `dataset`: auto = by file extension"
    )
    split: str = Field(default="train", description="`dataset`: the split to read (local files: every matched file is this split)")
    streaming: bool = Field(
        default=False, description="`dataset`: read rows as iterated (no Arrow cache written; row count unknown) instead of map-style"
    )
    weight: float = Field(default=1.0, gt=0, description="mixing weight: this source's share of samples is weight / sum of weights")
    columns: dict[str, str] | None = Field(
        default=None,
        description="`dataset`: which column is what, keys among messages, image, audio, prompt, response (values: column names). "
        "Unset: the table's `messages` column",
    )
    prompt: str | None = Field(default=None, description="`dataset` with `columns`: constant user text when there is no prompt column")
    media_role: Literal["user", "assistant"] = Field(
        default="user",
        description="`columns`: the image/audio column is an input of the user message (an encoder reads it) or a generation target "
        "in the assistant message (a decoder)",
    )
    on_exhausted: Literal["restart", "stop"] = Field(
        default="restart", description="when this source runs out: restart it (next epoch of it) or stop the run"
    )

    @model_validator(mode="after")
    def _consistent(self) -> SourceConfig:
        if (self.path is None) == (self.dataset is None):
            raise ValueError("give exactly one of `path` (chat JSONL) or `dataset` (a table read through Hugging Face datasets)")
        if self.path is not None:
            table_only = sorted(
                k for k in ("format", "split", "streaming", "columns", "prompt", "media_role") if k in self.model_fields_set
            )
            if table_only:
                raise ValueError(f"{', '.join(table_only)} apply to `dataset` sources only; a `path` source is chat JSONL, read lazily")
        if self.columns is not None:
            _check_columns(self.columns, self.prompt, self.media_role)
        elif self.prompt is not None:
            raise ValueError("`prompt` needs `columns` (it is the user text of a column-mapped table)")
        return self


def _check_columns(columns: dict[str, str], prompt: str | None, media_role: str) -> None:
    """Raise ValueError unless ``columns`` maps known keys to a chat sample with a user and an assistant part."""
    unknown = sorted(set(columns) - set(SOURCE_COLUMNS))
    if unknown:
        raise ValueError(f"columns: unknown key(s) {unknown}; use {', '.join(SOURCE_COLUMNS)}")
    if "messages" in columns:
        if len(columns) > 1 or prompt is not None:
            raise ValueError("columns: `messages` holds the whole chat; give it alone (no other columns, no prompt)")
        return
    if "prompt" in columns and prompt is not None:
        raise ValueError("give either columns.prompt (a column) or prompt (a constant text), not both")
    media = bool({"image", "audio"} & set(columns))
    if not ("prompt" in columns or prompt is not None or (media and media_role == "user")):
        raise ValueError("the user message would be empty: map a prompt column (or an image/audio column), or set a constant `prompt`")
    if not ("response" in columns or (media and media_role == "assistant")):
        raise ValueError("the assistant message would be empty: map `response` (e.g. columns: {image: image, response: text})")


class DataConfig(_Strict):
    train: str | None = Field(
        default=None,
        description="training chat JSONL: a file, folder or glob (shorthand for sources: [{path: ...}]); media paths relative to each file",
    )
    sources: list[SourceConfig] = Field(
        default_factory=list, description="training data sources, mixed by weight (instead of train); see SourceConfig"
    )
    eval: str | list[str] | None = Field(
        default=None,
        description="held-out chat JSONL for validation (eval.every) and `omnicore eval`: a file, folder or glob as data.train, or "
        "a list of them, read in the order given (each glob's or folder's files sorted; a file named twice is read once)",
    )
    max_tokens: int = Field(default=1024, gt=0, description="token budget of one packed micro-batch (all samples share one row)")
    max_samples: int | None = Field(default=None, gt=0, description="use only the first N rows of each source (per epoch)")
    on_error: Literal["raise", "skip"] = Field(
        default="raise", description="bad sample (missing/unreadable media, malformed line): stop with the file and line, or skip and count"
    )
    shuffle: bool = Field(default=True, description="shuffle samples each epoch (seeded by run.seed and the epoch)")
    packing: Literal["first_fit", "ffd"] = Field(
        default="first_fit",
        description="how samples fill micro-batches: first_fit in the shuffled order, or ffd (first-fit decreasing per window of "
        "packing_window samples, rows shuffled after: fuller rows, rows of similar-length samples)",
    )
    packing_window: int = Field(
        default=1024,
        gt=0,
        description="samples packed together: each window of this many samples of a data shard is packed into rows on its own "
        "(larger: fuller rows; the training process holds one window of preprocessed samples per shard)",
    )
    shuffle_buffer: int = Field(
        default=10000, ge=0, description="records (not yet decoded) in each shard's streaming shuffle buffer; 0 or 1: no shuffling"
    )
    num_workers: int = Field(
        default=2,
        ge=0,
        description="DataLoader worker processes per rank that read, decode and preprocess; 0: read in the training process",
    )
    worker_nice: int = Field(
        default=19,
        ge=0,
        le=19,
        description="niceness the DataLoader workers add to their own (os.nice, where the system has it), so that the training "
        "process keeps its cores when both want them: the workers then decode in the time the training step leaves idle instead of "
        "slowing it down, which matters where the CPU is shared (a CPU-only run, a few cores per GPU); 0: the training process's "
        "priority",
    )
    prefetch_factor: int = Field(
        default=4,
        gt=0,
        description="chunks (16 samples each) every worker keeps ready, at least; raised so that the next packing window of every "
        "shard is decoded while the current one trains",
    )
    pin_memory: bool | None = Field(default=None, description="pin micro-batches in page-locked memory; unset: on with CUDA")
    system_prompt: str | None = Field(default=None, description="optional system message prepended to every sample")
    special_tokens_in_text: Literal["escape", "refuse"] = Field(
        default="escape",
        description="a special token string (<|im_start|>, <|im_end|>, <|pad|>, ...) written in message text: escape = tokenize it as "
        "plain text, never as the control token; refuse = a bad sample naming FILE:LINE (data.on_error applies). Placeholder "
        "strings (<|image_pad|>) are refused under both",
    )
    chat_template: Literal["auto", "chatml"] = Field(
        default="auto",
        description="how samples become tokens: auto = the foundation tokenizer's own chat template when it has one "
        "(apply_chat_template; the assistant's content and the template's end-of-turn token are the labels, generation stops "
        "at that token; a sample the template rewrites, as Qwen3's drops earlier <think> blocks, is trained as the template "
        "renders it; a template omnicore cannot follow is refused at start-up), else ChatML; chatml = always omnicore's ChatML",
    )

    @field_validator("eval")
    @classmethod
    def _eval_entries(cls, value: str | list[str] | None) -> str | list[str] | None:
        entries = [value] if isinstance(value, str) else value
        if entries is not None and (not entries or not all(e.strip() for e in entries)):
            raise ValueError("data.eval: give a file, folder or glob, or a list of them (no empty entry); or null for no held-out data")
        return value

    @model_validator(mode="after")
    def _one_kind_of_input(self) -> DataConfig:
        if (self.train is None) == (not self.sources):
            raise ValueError("give data.train (one JSONL file) or data.sources (a list of sources), exactly one of them")
        return self

    def source_list(self) -> list[SourceConfig]:
        """The sources to read: ``sources``, or the one file of ``train``."""
        return list(self.sources) if self.sources else [SourceConfig(path=self.train)]


class TrainConfig(_Strict):
    max_steps: int = Field(default=100, gt=0, description="optimizer steps to run")
    lr: float = Field(default=1e-3, gt=0, description="peak learning rate of AdamW")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="final LR of the cosine decay as a fraction of lr")
    warmup_steps: int = Field(default=10, ge=0, description="linear warm-up steps from 0 to lr")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field(default=(0.9, 0.95), description="AdamW betas")
    grad_clip: float = Field(default=1.0, ge=0, description="clip the global gradient L2 norm to this (0 disables)")
    grad_accum: int = Field(default=1, gt=0, description="packed micro-batches per rank per optimizer step")
    stop_after: int | None = Field(
        default=None,
        gt=0,
        description="stop with a checkpoint after this step, as if interrupted (the LR schedule still spans max_steps); --resume continues",
    )
    log_every: int = Field(default=1, gt=0, description="append metrics to metrics.jsonl every N steps")
    code_cache_mb: float = Field(
        default=256,
        ge=0,
        description="host memory (MiB) for the codes of decoder targets already seen, so a frozen tokenizer (a decoder whose "
        "fixed_codes is true: MoVQGAN, EnCodec) encodes each target once, not once per epoch; least recently used codes are "
        "dropped beyond it (omnicore.model.code_cache; 0 = encode every time)",
    )
    save_every: int = Field(default=0, ge=0, description="save a checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(default=2, gt=0, description="keep the newest N checkpoints")
    export: bool = Field(default=True, description="export the trained components as safetensors folders at the end")
    progress: bool = Field(default=True, description="show a progress bar on rank 0")
    mixed_precision: Literal["none", "bf16"] = Field(
        default="none",
        description="bf16: compute in bfloat16 (autocast; FSDP2 also all-gathers bf16 parameters) with fp32 parameters, optimizer state, "
        "gradient reductions and loss; none: compute in run.dtype",
    )
    peak_tflops: float | None = Field(
        default=None,
        gt=0,
        description="peak dense TFLOP/s of one device for the MFU metric; unset: looked up for known GPUs, else MFU is not reported",
    )
    on_nonfinite: Literal["stop", "skip"] = Field(
        default="stop",
        description="a step whose loss (summed over ranks) or gradient norm is NaN or inf: stop raises before the optimizer step "
        "(the weights stay those of the last finite step; nothing is saved or exported); skip leaves weights and optimizer state "
        "as they were, marks the metrics row skipped and goes on (the LR schedule still advances)",
    )
    max_skipped_steps: int = Field(
        default=10,
        gt=0,
        description="with on_nonfinite: skip, how many non-finite steps in a row are skipped; the next one in a row stops the run",
    )
    freeze: list[str] = Field(
        default_factory=list,
        description="modules to freeze: dotted OmniModel module prefixes with fnmatch wildcards (lm, encoders.image.tower, "
        "lm.model.layers.*.mlp), or a published family's part names (vision_tower, merger, language_model); a prefix matches at dot boundaries; frozen parameters get no gradients and no optimizer state. "
        "A prefix that matches nothing, or freezing every parameter, is an error",
    )
    lr_multipliers: dict[str, float] = Field(
        default_factory=dict,
        description="module prefix (as in freeze) -> factor (finite, > 0) on train.lr for its parameters, e.g. {lm: 0.1}; where "
        "several match, the most specific (longest matched prefix) wins; a prefix that matches nothing is an error",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, raw: Any) -> Any:
        return _refuse_moved_keys("train", raw)

    @field_validator("freeze")
    @classmethod
    def _freeze_patterns(cls, patterns: list[str]) -> list[str]:
        for i, pattern in enumerate(patterns):
            _check_prefix(f"train.freeze[{i}]", pattern)
        return patterns

    @field_validator("lr_multipliers")
    @classmethod
    def _lr_factors(cls, multipliers: dict[str, float]) -> dict[str, float]:
        for pattern, factor in multipliers.items():
            _check_prefix(f"train.lr_multipliers.{pattern}", pattern)
            if not math.isfinite(factor) or factor < 0:
                raise PydanticCustomError(
                    "lr_factor",
                    "train.lr_multipliers.{key}: factor {factor} must be a finite number > 0",
                    {"key": pattern, "factor": factor},
                )
            if factor == 0:  # a zero-lr group would still hold gradients and AdamW state: say freeze
                raise PydanticCustomError(
                    "lr_factor",
                    "train.lr_multipliers.{key}: factor 0 would keep gradients and AdamW state for parameters that never change; "
                    "list {key} in train.freeze instead",
                    {"key": pattern},
                )
        return multipliers


def _check_prefix(field: str, pattern: str) -> None:
    """A ``train.freeze`` / ``train.lr_multipliers`` prefix must be a dotted module name (wildcards allowed)."""
    parts = pattern.split(".")
    if not pattern.strip() or any(not part or part != part.strip() for part in parts):
        raise PydanticCustomError(
            "module_prefix",
            "{field}: '{pattern}' is not a dotted module prefix (no empty parts, spaces or leading/trailing dots), e.g. lm or "
            "encoders.image",
            {"field": field, "pattern": pattern},
        )


class EvalConfig(_Strict):
    """Validation during training (:mod:`omnicore.eval.validate`): the held-out loss of ``data.eval``
    and, when asked, the task accuracy of generated answers, as a ``split: val`` row. ``omnicore
    eval`` reads ``max_samples`` too, so its held-out loss is the one validation logs."""

    every: int = Field(
        default=0,
        ge=0,
        description="held-out loss over data.eval every N steps and at the last step, as a 'split: val' row in metrics.jsonl "
        "(omnicore.eval.validate; 0 = off)",
    )
    max_samples: int | None = Field(
        default=None,
        gt=0,
        description="the held-out loss (validation and omnicore eval) uses only the first N samples of data.eval (None = all)",
    )
    task_samples: int = Field(
        default=0,
        ge=0,
        description="validation also generates answers for the first N samples of data.eval with a text answer (those of "
        "`omnicore eval --limit N`) and logs their exact-match accuracy, val_acc and val_acc/<task>, in the val row; needs "
        "eval.every (0 = off)",
    )

    @model_validator(mode="after")
    def _task_samples_need_every(self) -> EvalConfig:
        if self.task_samples and not self.every:
            raise ValueError("eval.task_samples is part of validation: set eval.every too, or eval.task_samples: 0")
        return self


class SamplesConfig(_Strict):
    """Sample grids during training (:mod:`omnicore.eval.samples`): the model answers fixed prompts
    with the ``generate`` section's sampling, and the images go to one labelled grid per step."""

    every: int = Field(
        default=0,
        ge=0,
        description="every N steps and at the last step, generate from samples.prompts (generate section's sampling, seed "
        "run.seed + i for prompt i) and write the images as one labelled grid to samples/step-NNNNNNNN.png (samples/final.png "
        "at the end) and to the loggers as samples/<modality> (omnicore.eval.samples; 0 = off)",
    )
    prompts: list[str] = Field(
        default_factory=list,
        description="the fixed user prompts of samples.every, one grid cell each (e.g. ['Draw the digit 0.', ...]); required "
        "with samples.every",
    )

    @model_validator(mode="after")
    def _every_needs_prompts(self) -> SamplesConfig:
        if self.every and not self.prompts:
            raise ValueError("samples.every needs samples.prompts (a list of prompts, e.g. ['Draw the digit 7.']); or samples.every: 0")
        return self


class ParallelConfig(_Strict):
    """How the run is distributed: the DeviceMesh sizes and the strategies applied to the model.

    The mesh is ``dp_replicate x dp_shard x ep x sp`` and its product must be the world size (one
    size may be -1: the rest). See :mod:`omnicore.parallel.mesh` for what each dim means and
    :mod:`omnicore.parallel.parallelize` for the order strategies are applied in.
    ``omnicore plan CONFIG --world-size N`` checks a layout without starting processes.
    """

    strategies: list[str | ComponentConfig] | None = Field(
        default=None,
        description="parallel strategies from the registry (names, or {name, options}), e.g. [ulysses, activation_checkpointing, fsdp2]; "
        "applied in phase order (attention, experts, checkpointing, compile, sharding), not list order; unset: [fsdp2] when launched "
        "on several processes, else [none]",
    )
    dp_replicate: int = Field(
        default=1,
        description="HSDP replicas: above 1, FSDP2 becomes HSDP (parameters replicated over this dim, sharded within); -1 = the rest",
    )
    dp_shard: int = Field(default=-1, description="FSDP2 shards per replica; -1 = the rest of the world size")
    sp: int = Field(default=1, description="sequence-parallel (Ulysses) size; ranks in one sp group read the same samples; -1 = the rest")
    ep: int = Field(
        default=1, description="expert-parallel size: experts split over this many ranks (each reads its own samples); -1 = the rest"
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="torch.distributed backend; auto picks nccl on CUDA, gloo on CPU"
    )

    def strategy_list(self, distributed: bool) -> list[ComponentConfig]:
        """The strategies to apply: ``strategies`` when set, else ``fsdp2`` when ``distributed``
        and ``none`` otherwise."""
        if self.strategies is not None:
            return [c if isinstance(c, ComponentConfig) else ComponentConfig(name=c) for c in self.strategies]
        return [ComponentConfig(name="fsdp2" if distributed else "none")]


class GenerateConfig(_Strict):
    """How `omnicore eval` and `omnicore generate` generate (:mod:`omnicore.model.generation`)."""

    max_new_tokens: int = Field(default=8, gt=0, description="text tokens generated per answer in eval/generate")
    temperature: float = Field(default=0.0, ge=0, description="0 is greedy decoding; otherwise softmax temperature")
    top_k: int = Field(default=0, ge=0, description="when sampling (temperature > 0), draw among the k most likely tokens only; 0 = all")
    top_p: float = Field(
        default=1.0, gt=0, le=1, description="when sampling, draw among the smallest set of tokens whose probability reaches top_p; 1 = all"
    )
    batch_size: int = Field(default=16, gt=0, description="prompts per forward in eval and generate (left-padded, KV-cached)")


class PluginsConfig(_Strict):
    """Which installed plugins this run may load; merged with the environment variables of the same
    names (``OMNICORE_DISABLE_PLUGINS``, ``OMNICORE_ALLOW_PLUGINS``, ``OMNICORE_STRICT``), see
    :mod:`omnicore.registry`. Names are entry-point names (``whisper``) or distribution names
    (``omnicore-audio-whisper``); built-in components are always on."""

    disable: list[str] = Field(
        default_factory=list, description="plugins not to load (not even imported), added to OMNICORE_DISABLE_PLUGINS"
    )
    allow: list[str] | None = Field(
        default=None, description="if set, only these plugins load (built-ins stay on); merged with OMNICORE_ALLOW_PLUGINS"
    )
    strict: bool = Field(
        default=False,
        description="a failed or incompatible plugin stops the run instead of being skipped (OMNICORE_STRICT=1 also turns this on)",
    )


class RunConfig(_Strict):
    output_dir: str = Field(
        default="runs/default", description="checkpoints, exports and metrics.jsonl go here (relative to the current directory)"
    )
    seed: int = Field(
        default=0,
        description="seeds model init, data order, sampling and every random stream: per sample (augmentation) and per rank (dropout)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="where to train")
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="parameter and compute dtype")
    loggers: list[str | ComponentConfig] = Field(
        default_factory=lambda: ["jsonl"],
        description="where metrics rows, validation rows and images go (rank 0 only), several at once: registry names (jsonl: "
        "metrics.jsonl in run.output_dir; tensorboard, wandb, mlflow with the omnicore-logger-<name> plugins) or {name, options}; [] logs "
        "nowhere (see `omnicore plugins --kind logger`)",
    )
    verify: bool = Field(
        default=True,
        description="check checkpoints and exports against their checksum manifests, and a resume's data files against the "
        "checkpoint's, before reading them; one that cannot be verified (no manifest) or fails is refused. false (--no-verify) "
        "loads them unchecked, with a warning",
    )

    def logger_list(self) -> list[ComponentConfig]:
        """``loggers`` with every bare name turned into a :class:`ComponentConfig`, in order."""
        return [c if isinstance(c, ComponentConfig) else ComponentConfig(name=c) for c in self.loggers]


class Config(_Strict):
    """The whole run: ``run``, ``model``, ``data``, ``train``, ``eval``, ``samples``, ``parallel``,
    ``generate``, ``plugins``."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig, description="validation during training (held-out loss, task accuracy)")
    samples: SamplesConfig = Field(default_factory=SamplesConfig, description="sample grids during training")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    plugins: PluginsConfig = Field(default_factory=PluginsConfig, description="which installed plugins may load (disable, allow, strict)")
    source: str | None = Field(default=None, exclude=True, description="the file this config came from (set by load_config)")
    command: list[str] | None = Field(
        default=None,
        exclude=True,
        description="the command line after `omnicore` that started this run (set by the CLI), for --resume hints",
    )

    @field_validator("eval")
    @classmethod
    def _eval_needs_data(cls, ev: EvalConfig, info: Any) -> EvalConfig:
        data = info.data.get("data")  # validated before eval (declared first); absent when it failed
        if ev.every and data is not None and not data.eval:
            raise ValueError("eval.every needs data.eval (a held-out chat JSONL); set data.eval or eval.every: 0")
        return ev

    @field_validator("samples")
    @classmethod
    def _samples_need_decoders(cls, samples: SamplesConfig, info: Any) -> SamplesConfig:
        model = info.data.get("model")
        if samples.every and model is not None and not model.decoders:
            raise ValueError("samples.every draws with the model's decoders, and model.decoders is empty; set samples.every: 0")
        return samples

    def resolve_path(self, p: str) -> Path:
        """A data path from config, relative to the config file's folder when not absolute."""
        path = Path(p)
        if path.is_absolute() or self.source is None:
            return path
        return Path(self.source).parent / path


def _closest(key: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    fields = list(model.model_fields)
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (the parent of the last element)."""
    model: Any = Config
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        if getattr(ann, "__origin__", None) is dict and parts:
            parts.pop(0)  # the dict key, e.g. the modality in encoders.<modality>
            model = args[-1]
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _dotted_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.add(key)
        if isinstance(v, dict):
            out |= _dotted_keys(v, key + ".")
    return out


def _given_where(dotted: str, given: set[str], source: str) -> str:
    """Where the key ``dotted`` (or the section holding it) was given: ``command line (--KEY)`` for
    the longest of its prefixes among the overrides' keys ``given``, else ``source`` (the file)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in given:
            return f"command line (--{key})"
    return source


def format_errors(exc: ValidationError, source: str, overrides: dict[str, Any] | None = None) -> str:
    """Turn pydantic errors into ``FILE: dotted.key: message`` lines, with closest-key hints.

    An error in a key given as a command-line override names ``command line (--dotted.key)``
    instead of the file.
    """
    lines = []
    given = _dotted_keys(overrides or {})
    for err in exc.errors():
        loc = tuple(err["loc"])
        dotted = ".".join(str(x) for x in loc)
        where = _given_where(dotted, given, source)
        if err["type"] == "moved_key":  # one line per moved key, naming it where it was given
            for old, new in err["ctx"]["moved"]:
                lines.append(f"{_given_where(old, given, source)}: {old}: moved to {new}")
            continue
        if err["type"] == "extra_forbidden" and dotted in REMOVED_KEYS:
            msg = f"was removed; use {REMOVED_KEYS[dotted]}"
        elif err["type"] == "extra_forbidden":
            msg = "unknown key" + _closest(str(loc[-1]), _model_at(loc))
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "finite_number":  # allow_inf_nan=False (_Strict): .inf, .nan
            msg = f"{err['input']} is not a finite number; give a finite value"
        elif err["type"] == "finite_option":  # inside a component's options: name the key within them
            dotted = f"{dotted}.{err['ctx']['key']}"
            where = _given_where(dotted, given, source)
            msg = f"{err['ctx']['value']} is not a finite number; give a finite value"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {dotted}: {msg}")
    return "\n".join(lines)


_YAML12_FLOAT = r"""^[-+]?(?:(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"""
"""YAML 1.2 floats (``1e-6``, ``-1E+3``, ``.5``, ``2.``, ``.inf``); YAML 1.1 (PyYAML's default)
needs a dot in ``1.0e-6`` and reads ``1e-6`` as a string."""


def yaml_load(text: str) -> Any:
    """Parse YAML with PyYAML's safe loader, except that numbers follow YAML 1.2: ``1e-6`` and
    ``-1E+3`` are floats (PyYAML, following YAML 1.1, makes them strings). Used for config files and
    command-line override values alike.

    Raises:
        yaml.YAMLError: for text that is not YAML.
    """
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass


@functools.cache
def _yaml_loader() -> Any:
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2 float resolution."""

    Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for first in list(Loader.yaml_implicit_resolvers):
        Loader.yaml_implicit_resolvers[first] = [r for r in Loader.yaml_implicit_resolvers[first] if r[0] != "tag:yaml.org,2002:float"]
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_YAML12_FLOAT), list("-+0123456789."))
    return Loader


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--train.max_steps", "50", "--run.seed=3"]`` -> nested dict ``{"train": {"max_steps": 50}, ...}``.

    Raises:
        ConfigError: for an argument that is not ``--dotted.key VALUE`` or ``--dotted.key=VALUE``.
    """
    import yaml

    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"override {arg!r}: expected --section.key VALUE (for example --train.max_steps 50)")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"override --{key} has no value")
            value = args[i + 1]
            i += 1
        i += 1
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override --{key} conflicts with another override")
        try:
            node[parts[-1]] = yaml_load(value)
        except yaml.YAMLError as exc:
            detail = " ".join(str(getattr(exc, "problem", None) or exc).split())
            raise ConfigError(f"override --{key}: value {value!r} is not valid YAML ({detail}); quote it to pass a string") from exc
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the overrides ``extra`` merged in: mappings merge key by key, other values
    replace, and ``None`` (``--model.decoders null``) removes the key, at any depth, so the field
    takes its default (a table such as ``model.decoders`` becomes empty; ``--model.decoders.image
    null`` removes one entry). No field accepts ``None`` beside a default other than ``None``, so
    removing a key and setting it to ``None`` never differ."""
    out = dict(base)
    for k, v in extra.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = _merge(out[k] if isinstance(out.get(k), dict) else {}, v)
        else:
            out[k] = v
    return out


def load_config(path: str | Path, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Read, merge overrides into, and validate a YAML config.

    Raises:
        ConfigError: the file is missing or not YAML (with its line), or a key is unknown or invalid
            (``FILE: dotted.key: message``).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml_load(path.read_text(encoding="utf-8-sig")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        # one line: PyYAML's own text spans several lines and calls the file "<unicode string>"
        detail = ", ".join(str(x) for x in (getattr(exc, "context", None), getattr(exc, "problem", None)) if x)
        raise ConfigError(f"{where}: not valid YAML: {detail or ' '.join(str(exc).split())}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (run, model, data, train, ...)")
    extra = parse_overrides(overrides) if isinstance(overrides, list) else (overrides or {})
    merged = _merge(raw, extra)
    try:
        cfg = Config.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, str(path), extra)) from exc
    cfg.source = str(path)
    return cfg
