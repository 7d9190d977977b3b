"""Component specs and the contract each kind of component implements.

This module is imported by ``omnicore plugins`` and by every plugin's hook module, so it must stay
torch-free: the contracts below are ``typing.Protocol`` classes that only *name* tensor types in
strings.

A plugin's hook returns light :class:`ComponentSpec` objects. Nothing heavy is imported until a
component is built: the spec's ``target`` is a ``"module:attr"`` string that the registry resolves
lazily (see :meth:`omnicore.registry.Registry.build`).

The six kinds and what their ``target`` factory must return (each contract below lists every
member the core reads; PLUGINS.md's reference is generated from the same text and checked by
``tests/test_docs.py``):

========== ================================================ ===========================================
kind       factory signature                                returns
========== ================================================ ===========================================
encoder    ``factory(options: dict, *, hidden_size: int)``  an ``nn.Module`` implementing :class:`Encoder`
decoder    ``factory(options: dict, *, hidden_size: int)``  an ``nn.Module`` implementing :class:`Decoder`
processor  ``factory(options: dict)`` (an encoder's or      an object implementing :class:`Processor`
           decoder's ``processor``, see below)              (no ``nn.Module``, no weights)
foundation ``factory(options: dict)``                       an object implementing :class:`Foundation`
parallel   ``factory(options: dict)``                       an object implementing :class:`ParallelStrategy`
                                                            (and :class:`SequenceParallel` if it splits batches)
kernel     ``factory(options: dict)``                       an object implementing :class:`Kernel`
logger     ``factory(options: dict)``                       an object implementing :class:`Logger`
========== ================================================ ===========================================

Encoders and decoders come in two parts, as transformers splits ``AutoProcessor`` from
``AutoModel``: the *processor* (:class:`Processor`: read media, ``preprocess``, ``num_tokens``,
``collate``) runs in data workers and is built from the component's options alone, without building
the ``nn.Module`` or reading weights; the module (:class:`Encoder`, :class:`Decoder`) is the model
side. A spec names the processor's factory in ``ComponentSpec.processor``, and the built module
holds the same processor as its ``processor`` attribute (the model side reads the data side there).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from omnicore.data.positions import RopeLayout

KINDS: tuple[str, ...] = ("encoder", "decoder", "foundation", "parallel", "kernel", "logger")
"""The six component kinds, in the order ``omnicore plugins`` lists them."""


@dataclass(frozen=True)
class ComponentSpec:
    """What a plugin registers: a light, import-free description of one component.

    A hook of :mod:`omnicore.hookspecs` returns a ``list[ComponentSpec]``; the hook states the kind
    (``omnicore_encoders`` registers encoders), so a spec does not repeat it: the registry fills
    :attr:`kind` in from the hook that returned the spec (:meth:`of_kind`).

    Attributes:
        name: the name users write in config (``encoders: {audio: {name: whisper}}``). Lower case,
            letters, digits, ``_`` and ``-``.
        target: ``"package.module:factory"``, imported only when the component is built.
        description: one line for ``omnicore plugins``.
        modalities: for encoders and decoders, the modalities handled (``("audio",)``).
        requires: capabilities the component needs at build time, e.g. ``("cuda",)``.
        options_model: optional ``"module:Class"`` of a pydantic model that validates the
            component's ``options`` from config (imported lazily, at build time).
        processor: encoders and decoders: ``"package.module:factory"`` of the data-side part,
            imported lazily; ``factory(options)`` (options validated by ``options_model`` as for
            the component) returns a :class:`Processor` without building any ``nn.Module`` or
            reading weights. Its module must not import model code. Required for encoders and
            decoders, not allowed for the other kinds.
        extra: free-form metadata (``install``: the pip command that provides a missing requirement).
        kind: one of :data:`KINDS`; not a constructor argument: set by the registry from the hook.

    Raises:
        ValueError: on construction, if ``name`` is empty or malformed, or ``target`` or
            ``processor`` is not of the form ``module:attr``; from :meth:`of_kind`, if ``kind`` is
            unknown or ``processor`` is missing (encoder, decoder) or not allowed (other kinds).
    """

    name: str
    target: str
    description: str = ""
    modalities: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    options_model: str | None = None
    processor: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    kind: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not all(c.isalnum() or c in "_-" for c in self.name):
            raise ValueError(f"ComponentSpec name {self.name!r} must be non-empty and use only letters, digits, '_' and '-'")
        if not _is_target(self.target):
            raise ValueError(f"ComponentSpec {self.name}: target {self.target!r} must be 'module:attr'")
        if self.processor is not None and not _is_target(self.processor):
            raise ValueError(f"ComponentSpec {self.name}: processor {self.processor!r} must be 'module:factory'")

    def of_kind(self, kind: str) -> ComponentSpec:
        """A copy of this spec with :attr:`kind` set: what the registry keeps for a spec returned
        by the hook of ``kind``.

        Raises:
            ValueError: ``kind`` is not one of :data:`KINDS`; an encoder or decoder names no
                ``processor``; another kind names one.
        """
        if kind not in KINDS:
            raise ValueError(f"ComponentSpec {self.name}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if kind in ("encoder", "decoder") and self.processor is None:
            raise ValueError(
                f"{kind}/{self.name} names no processor: add processor='package.module:factory' to its ComponentSpec "
                "(factory(options) returns the data side, an omnicore.api.Processor, without building weights)"
            )
        if kind not in ("encoder", "decoder") and self.processor is not None:
            raise ValueError(f"{kind}/{self.name}: processor= is only for encoders and decoders (the data side of a medium); remove it")
        bound = copy.copy(self)
        object.__setattr__(bound, "kind", kind)
        return bound

    @property
    def key(self) -> str:
        """``kind/name``, the string used in messages and in ``omnicore plugins``."""
        return f"{self.kind}/{self.name}"


def _is_target(value: str) -> bool:
    """Whether ``value`` has the form ``module:attr`` (both parts non-empty)."""
    return isinstance(value, str) and ":" in value and not value.startswith(":") and not value.endswith(":")


# --------------------------------------------------------------------------------------------
# Contracts. Tensor shapes use: B = items in a batch of one modality, T = tokens, H = the
# foundation's hidden size, C = codebook size.
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Processor(Protocol):
    """The data side of an encoder or decoder (the transformers ``AutoProcessor`` to the module's
    ``AutoModel``): media to CPU features, their token count, and batching.

    Built by ``ComponentSpec.processor``'s ``factory(options)`` from the component's options alone:
    no ``nn.Module`` is built and no weights are read (a checkpoint folder's configuration files,
    such as ``config.json`` or ``preprocessor_config.json``, may be). Data workers (``DataLoader``
    worker processes) use only processors, so a processor must be picklable (workers may be
    spawned) and its module must import no model code. The module of the same component, built
    from the same options, must agree with it exactly: the same features, the same
    :meth:`num_tokens` (the number of output embeddings, or of codes, of the module) and the same
    collated batch, which the module's ``forward`` (encoders) or ``encode`` (decoders) takes.

    Optional: ``grid(features) -> tuple[int, int, int]``, the ``(t, h, w)`` layout of one item's
    tokens as placed in the foundation (after any spatial merge; tokens in t, h, w raster order),
    with ``t * h * w == num_tokens(features)``. Read only for an mRoPE foundation
    (:mod:`omnicore.data.positions`); an encoder whose processor lacks it (audio) is laid out as
    text. Decoders' grids are not used (their codes are laid out as text). With ``grid``,
    optionally ``time_interval(features) -> float``: rotary positions per frame group along ``t``
    (Qwen2.5-VL's ``tokens_per_second * second_per_grid_t``; default 1, frame groups counted).

    Optional (encoders, with ``grid``): ``runs(features) -> list[tuple[str, tuple[int, int, int]]]``,
    for an item written as several runs of placeholders with text between them (Qwen3-VL writes a
    clip as one ``<t seconds>`` timestamp and one wrapped run per frame group): per run, the text
    written before it (tokenized as plain text, ``""`` for none) and its ``(t, h, w)`` grid; the
    runs' tokens add up to ``num_tokens(features)``, each run is wrapped in ``wrap`` and laid out as
    its own mRoPE block. Without it an item is one run: its ``grid``, no text.

    Optional (encoders): ``layout(features) -> ItemLayout``, for an item that writes its tokens
    itself (:class:`omnicore.api.ItemLayout`): every token of the item (its wrap included), the
    items of each modality whose rows fill its placeholders, and its rotary positions for an mRoPE
    foundation. Qwen2.5-Omni writes a clip with its sound track so: 2-second chunks of video and
    audio placeholders in turn, the audio rows from the audio encoder, time-aligned positions. With
    it, the item's ``runs``, ``grid`` and ``wrap`` are not used to write it.

    Optional (video processors): ``audio_track``, true to receive the clip's sound track as
    ``Video.audio`` (``omnicore.api.load_video(..., audio=True)``; None for a silent file).

    Optional (encoders): ``placeholder``, the token string written ``num_tokens`` times for one
    item (default ``<|{modality}_pad|>``), and ``wrap``, a pair of token strings written before and
    after that run (default none). A published family names its checkpoint's own tokens
    (``<|image_pad|>`` wrapped in ``<|vision_start|>``/``<|vision_end|>``, ``<image>``,
    ``<|AUDIO|>``), so that a sample's ids are those of the checkpoint's processor; the core adds
    a token only when the tokenizer lacks it. Each modality needs its own placeholder.

    Optional (decoders): ``codes_per_token``, the codes trained at each placeholder (an int,
    default 1): ``K`` for a decoder with ``K`` codebooks per frame (:class:`Decoder`), so that the
    data side counts a sample's targets as the model does.

    Optional (decoders): ``placeholder``, the token string written once per code position
    (default ``<|{modality}_out|>``), and ``start``, the token that opens a generated item (default
    ``<|{modality}_start|>``): a text target before the placeholders, and the token whose emission
    makes generation switch to the decoder. A published family names its checkpoint's own (CSM
    writes ``<|end_of_text|>`` then ``<|AUDIO|>`` per frame), so that a sample's ids are those of
    the checkpoint's processor; as for encoders, the core adds a token only when the tokenizer lacks it.
    """

    modality: str
    """``"image"``, ``"audio"``, ..."""

    def preprocess(self, media: Any) -> dict[str, Any]:
        """Turn one loaded medium into CPU features (runs in data workers, no gradients).

        ``media`` is a ``PIL.Image.Image`` for images, an :class:`omnicore.data.media.Audio`
        (float32 samples in [-1, 1], shape ``[num_samples]``, and ``sample_rate`` in Hz) for audio and
        an :class:`omnicore.data.media.Video` (uint8 RGB ``frames`` ``[T, H, W, 3]`` and ``fps``) for video.
        Returns a dict of CPU tensors for one item (no batch dim).
        """

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Number of placeholder tokens for one item's features: for an encoder, the number of
        output embeddings of the module; for a decoder, the number of code positions the target
        occupies. The one formula the data side and the model share."""

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Batch a list of per-item feature dicts (in order) for the module's ``forward``
        (encoder) or ``encode`` (decoder)."""


@dataclass
class EncoderOutput:
    """What an encoder's ``forward`` may return instead of a plain ``[N, H]`` tensor: rows for the
    placeholders plus rows that feed the foundation's intermediate layers (DeepStack, Meng et al.
    2024, as Qwen3-VL uses it: features of some intermediate vision-tower layers, each through its
    own merger, are added to the LM's hidden states at the visual positions after its first
    decoder layers; see transformers' ``Qwen3VLTextModel``).

    Attributes:
        embeds: ``[N, H]``, scattered into the placeholders as a plain encoder output is.
        layer_embeds: one ``[N, H]`` tensor per foundation layer they feed, in layer order, rows
            in the same order as ``embeds``. :class:`omnicore.model.omni.OmniModel` gathers them
            over every encoder modality in sequence order and hands them to the foundation's
            ``layer_inputs`` (:class:`FoundationOptional`).
    """

    embeds: Any
    layer_embeds: list[Any] = field(default_factory=list)


@runtime_checkable
class Encoder(Protocol):
    """An input-side modality encoder (VeOmni's ``lm_encode``): media to ``H``-wide embeddings.

    An encoder is an ``nn.Module`` whose output is already projected to the foundation's hidden size
    ``H`` (the factory receives ``hidden_size``). Its data side is a :class:`Processor` (built
    apart, from the same options, by ``ComponentSpec.processor``); the data side and the model
    share one formula for the number of placeholder tokens, :meth:`Processor.num_tokens`. The module
    holds that processor as :attr:`processor` (``omnicore generate`` and the chat encoder read it).

    Optional: ``flops(batch) -> float``, the model FLOPs (forward + backward, as training runs it:
    a frozen module's forward only) of :meth:`forward` on ``batch``, a batch from
    :meth:`Processor.collate`; the cost of one item is ``flops(processor.collate([features]))``.
    Without it the core measures the module once, on the first micro-batch holding its modality
    (``torch.utils.flop_counter``'s formulas), and scales that by the input elements of each
    later batch (:mod:`omnicore.model.flops`); the metrics' ``flops_share/encoder.<m>`` and MFU
    read either.
    """

    modality: str
    """``"image"``, ``"audio"``, ..."""

    processor: Processor
    """The data side built from the same options (what ``ComponentSpec.processor`` builds)."""

    def forward(self, batch: dict[str, Any]) -> Any:
        """Encode a batch from :meth:`Processor.collate`: returns ``[sum(num_tokens(item)), H]`` in
        item order, or an :class:`EncoderOutput` holding those rows and, per foundation layer they
        feed, another ``[sum(num_tokens(item)), H]`` (the foundation's ``layer_inputs`` takes them;
        :class:`FoundationOptional`)."""

    def dummy_batch(self) -> dict[str, Any]:
        """A one-item collated batch used when a rank's micro-batch lacks this modality.

        The model runs :meth:`forward` on it and adds ``0 * output.sum()`` to the loss, so that every
        parameter takes part in the backward pass and FSDP collectives never hang.
        """

    def save_pretrained(self, path: str) -> None:
        """Write a folder that the factory loads back with ``options["checkpoint"] = path``.

        The folder holds the wrapped backbone in its library's own format (``config.json`` and
        ``model.safetensors``, as ``save_pretrained`` of transformers or diffusers writes them) plus
        omnicore's own extra weights (such as the projection to ``H``) as safetensors.
        """


@runtime_checkable
class Decoder(Protocol):
    """An output-side modality decoder (VeOmni's ``lm_embed``/``lm_head``/``lm_generate``).

    The decoder owns a discrete tokenizer of its medium (for images, a VQ codebook). Training uses
    teacher forcing: targets become codes (:meth:`encode`), the codes are embedded as the foundation's
    inputs (:meth:`embed`), and the hidden state *before* each code position is scored against the
    codebook (:meth:`head`). Generation samples codes one at a time and :meth:`decode` turns them back.
    Its data side (target media to features, code counts, batching) is a :class:`Processor`, as
    for :class:`Encoder`.

    Optional: a ``fixed_codes`` attribute (bool, may be a property). True promises that
    :meth:`encode` is a deterministic function of each item's features that training does not
    change (a frozen tokenizer in eval mode) and that an item's codes do not depend on the other
    items of its batch; the core then encodes each target once and reuses its codes
    (``train.code_cache_mb``, :mod:`omnicore.model.code_cache`). Absent or false: every target is
    encoded on every step. The contract suite checks the promise.

    Optional: ``flops(batch) -> float``, as for :class:`Encoder`: the model FLOPs of training on
    the targets of ``batch`` (a batch from :meth:`Processor.collate`): :meth:`encode` (forward),
    :meth:`embed`, :meth:`head` and the depth decoder below (forward + backward). Without it the
    core measures them once and scales by input elements; the part of :meth:`encode` run without
    gradients is then left out for targets whose codes come from the code cache.

    Optional: **several codebooks per frame** (one LM position a frame; the depth decoder design of
    CSM and Moshi, built by :class:`omnicore.api.CodebookDecoder` with ``num_codebooks=K``). A
    decoder with a ``num_codebooks`` attribute ``K > 1`` has codes ``[N, K]`` wherever codes
    ``[N]`` are written below (``codebook_size`` is then the entries of each codebook, ``N`` the
    frames, one placeholder each), :meth:`head` scores codebook 0, and it has two more members:

    * ``depth_logits(hidden [N, H], codes [N, K]) -> [N, K-1, C]``: teacher-forced logits of
      codebooks ``1..K-1`` from the foundation's hidden state that :meth:`head` scored and the
      frame's earlier codes; the core adds their cross-entropy as the part ``"<modality>.depth"``;
    * ``depth_generate(hidden [N, H], first [N], pick) -> [N, K]``: the frame's codes, codebook 0
      being ``first`` and codebook ``k`` ``pick(logits [N, C], k)``; greedy ``pick`` must give the
      argmax of ``depth_logits`` on the returned codes (generation equals teacher forcing).
    """

    modality: str
    """``"image"``, ``"audio"``, ..."""

    codebook_size: int
    """``C``, the number of codes (the logits' width of :meth:`head`)."""

    processor: Processor
    """The data side built from the same options (what ``ComponentSpec.processor`` builds)."""

    def encode(self, batch: dict[str, Any]) -> Any:
        """Target features (a batch from :meth:`Processor.collate`) to codes: LongTensor
        ``[sum(num_tokens(item))]`` in item order, no grad."""

    def embed(self, codes: Any) -> Any:
        """Codes ``[N]`` (long) to input embeddings ``[N, H]``."""

    def head(self, hidden: Any) -> Any:
        """Hidden states ``[N, H]`` to codebook logits ``[N, C]``."""

    def decode(self, codes: Any) -> Any:
        """Codes of one item ``[num_tokens]`` back to the medium: a ``PIL.Image.Image`` for images, or an
        :class:`omnicore.data.media.Audio` (``omnicore.api.Audio``: float32 samples in [-1, 1],
        ``sample_rate`` in Hz) for audio; the core writes the first as PNG and the second as WAV."""

    def dummy_codes(self) -> Any:
        """A LongTensor of codes used for the dummy pass on ranks without this modality."""

    def save_pretrained(self, path: str) -> None:
        """Write a folder that the factory loads back with ``options["checkpoint"] = path``.

        The folder holds the wrapped backbone in its library's own format (``config.json`` and
        ``model.safetensors``, as ``save_pretrained`` of transformers or diffusers writes them) plus
        omnicore's own extra weights (such as the projection to ``H``) as safetensors.
        """


@runtime_checkable
class Foundation(Protocol):
    """Builds the foundation language model and its tokenizer.

    ``build_model()`` returns a Hugging Face ``PreTrainedModel`` causal LM (``[B, T] -> [B, T, V]``)
    whose ``get_input_embeddings()`` and ``model`` attributes behave as in transformers;
    ``build_tokenizer()`` returns a ``PreTrainedTokenizerFast``.

    ``build_model`` may take a ``dtype`` keyword (a ``torch.dtype``: the component's ``dtype``,
    else ``run.dtype``); without it the core casts the model after building. It may return the
    model with its parameters on the meta device and an ``omnicore_pending_load`` attribute (a
    :class:`omnicore.model.loading.PendingLoad`, from :func:`omnicore.model.loading.plan_load`):
    the core then shards the model first and each rank reads only its shards
    (:func:`omnicore.model.loading.fill_pending`); the built-in ``hf_causal_lm`` does this for
    safetensors checkpoints.

    A published model *family* (a composite checkpoint: towers, projector and language model in
    one folder; the ``omnicore-family-*`` plugins are examples) also implements the members of
    :class:`FoundationOptional` it needs.
    """

    def build_tokenizer(self) -> Any:
        """The foundation's text tokenizer, a transformers ``PreTrainedTokenizerFast``."""

    def build_model(self, vocab_size: int) -> Any:
        """The causal LM with at least ``vocab_size`` input embeddings (the tokenizer's vocabulary
        plus omnicore's special tokens; the core resizes when it has fewer)."""


class FoundationOptional(Protocol):
    """The optional members of a :class:`Foundation`, with their exact signatures, for a published
    model family. The core reads each with ``getattr`` and a default
    (:mod:`omnicore.model.build`, :mod:`omnicore.checkpoint.export`, :mod:`omnicore.eval.generate`),
    so a plain language model implements none of them."""

    def encoders(self) -> dict[str, dict[str, Any]]:
        """The encoder entries the checkpoint brings, each as written under ``model.encoders``
        (``{"name": ..., "options": {...}, "share": ...}``). The core adds each one whose key the
        config does not set, so one foundation entry builds the whole model. Building the
        foundation object must read no weights."""

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Any) -> None:
        """Write ``folder`` in the published layout (the composite ``config.json``, tensors under
        the keys the family's ``...ForConditionalGeneration.from_pretrained`` expects, tokenizer
        and processor files), from an unsharded CPU :class:`ParallelModel` whose LoRA adapters are
        merged."""

    def layer_inputs(self, mask: Any, per_layer: list[Any]) -> dict[str, Any]:
        """The foundation's keyword arguments that carry encoder rows into its intermediate layers
        (see :class:`EncoderOutput`): ``mask`` bool ``[B, T]`` marks the positions of every encoder
        placeholder whose encoder returned layer rows, ``per_layer`` holds one ``[n, H]`` tensor per
        layer (``n = mask.sum()``, rows in sequence order). Read when the model is built, called in
        every forward and in the prefill of generation; required when an encoder returns
        :class:`EncoderOutput` with layer rows."""

    def rope_layout(self) -> RopeLayout | None:
        """The :class:`~omnicore.data.positions.RopeLayout` of a language model that rotates by 3-D
        positions (mRoPE), or None for 1-D positions; read once when the model is built
        (``OmniModel.rope``), and it overrides what the core infers from the model's config
        (:func:`omnicore.data.positions.rope_layout`, which knows only the Qwen model types). With a
        layout, every sample carries ``[3][T]`` positions (each media item's from its processor:
        ``ItemLayout.positions``, or its ``grid``) and the language model's ``base_model`` takes
        ``position_ids`` ``[4, B, T]``: the plain 1-D row (which keeps packed samples apart), then the
        three axes."""

    def part_names(self) -> dict[str, list[str]]:
        """The family's part names (``vision_tower``, ``merger``, ``language_model``) -> parameter
        name prefixes in the model, accepted by ``train.freeze`` and ``train.lr_multipliers``."""

    def media_span_inputs(
        self, config: Any, spans: dict[str, Any], position_ids: Any, inputs_embeds: Any, attention_mask: Any = None, cache: Any = None
    ) -> dict[str, Any]:
        """The foundation's keyword arguments (its attention masks) for attention that is
        bidirectional within *media spans*: the tokens of one medium see each other whatever their
        order, and attention is causal elsewhere (the images of some vision-language models).
        ``spans`` maps each encoder modality to a LongTensor ``[B, T]``: on each of its placeholder
        tokens, the index of its run of consecutive placeholders along the row (0, 1, ...: one
        medium), -1 elsewhere (:func:`omnicore.model.omni.media_spans`; transformers'
        ``block_sequence_ids``); the foundation uses the modalities its class treats so. ``config``
        is the language model's config as built (``_attn_implementation``: the
        ``model.kernels.attention`` kernel's); ``position_ids`` ``[B, T]``, ``inputs_embeds``
        ``[B, T, H]``. Called in every forward on the packed row (``attention_mask`` and ``cache``
        None: the masks must keep the packed samples apart, as the restarting ``position_ids`` mark
        them) and in the prefill of generation (the ``[B, T]`` padding mask and the cache). Returns
        ``{}`` where the row has no span. The core then requires an attention kernel that applies
        masks (``sdpa``, ``eager``) and refuses sequence parallelism (``parallel.sp`` above 1: the
        masks span the whole row)."""

    def speak(self, prompt: Any, processors: dict[str, Any], *, max_new_tokens: int, seed: int, stop_id: Any = None) -> dict[str, Any]:
        """The answer to one encoded prompt (``ChatProcessor.encode(..., prompt_only=True)``),
        written and spoken by the family's own generation from its checkpoint folder (an export:
        Qwen2.5-Omni's thinker, talker and token2wav), for ``omnicore generate --speak``:
        ``{"text": str, "token_ids": [int], "audio": Audio}``. ``processors``: the encoders'
        (modality -> :class:`Processor`) to collate the prompt's media; ``seed`` seeds the voice."""


PHASES: tuple[str, ...] = ("attention", "experts", "checkpointing", "compile", "sharding")
"""The phases of :attr:`ParallelStrategy.phase`, in the order strategies are applied (see
:mod:`omnicore.parallel.parallelize` for why each comes where it does)."""

DEFAULT_PHASE = "sharding"
"""The phase of a strategy that declares none (FSDP-like wrappers)."""


@dataclass(frozen=True)
class Violation:
    """One violated constraint of a parallel layout, from :meth:`ParallelStrategy.validate` or the
    core's own mesh checks.

    Attributes:
        field: the config key to change (``parallel.sp``, ``parallel.strategies``).
        message: what is wrong and what to change.
        source: who found it (a strategy name, or ``mesh``).
    """

    field: str
    message: str
    source: str = "mesh"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class StrategyPlan:
    """What a strategy would do to a model (:meth:`ParallelStrategy.plan`, shown by ``omnicore plan``).

    Attributes:
        modules: qualified names of the modules it wraps (``""`` or ``"(root)"`` for the root).
        shards: ``{parameter name: (mesh dim, ways)}`` for each parameter it splits along dim 0;
            ``omnicore plan`` divides that parameter's bytes by ``ways`` per rank.
        note: one line for the report.
    """

    modules: list[str] = field(default_factory=list)
    shards: dict[str, tuple[str, int]] = field(default_factory=dict)
    note: str = ""


@dataclass
class EncoderCall:
    """One call of an encoder module on a micro-batch's items of one modality, as
    :meth:`ParallelModel.register_encoder_hook` hands it to a hook (a strategy that moves encoder
    work between ranks wraps the call here).

    Attributes:
        modality: the modality encoded (a shared modality's own name, ``model.encoders.<m>.share``).
        module: the encoder module that encodes it (possibly wrapped by FSDP2).
        processor: the modality's :class:`Processor` (``num_tokens``, ``collate``): for a shared
            modality its own, not the module's.
        batch: this micro-batch's items of ``modality``, collated (:meth:`Processor.collate`), on the
            model's device; None when the micro-batch holds none.
        encode: ``encode(batch) -> output``: the module's forward on a collated batch (floating-point
            features cast to the module's parameter dtype), through the hooks registered after this
            one; ``encode(None)`` runs the module's dummy batch.
        dummy_batch: ``dummy_batch() -> batch``: the module's one-item dummy batch
            (:meth:`Encoder.dummy_batch`), built outside autocast.
    """

    modality: str
    module: Any
    processor: Any
    batch: Any
    encode: Any
    dummy_batch: Any


@runtime_checkable
class ParallelModel(Protocol):
    """What a parallel strategy may rely on in the model it is given (an
    :class:`omnicore.model.omni.OmniModel`, an ``nn.Module``): nothing else is stable.
    """

    lm: Any
    """The foundation, a transformers ``PreTrainedModel`` (``lm.config``, ``set_attn_implementation``)."""

    encoders: Any
    """``nn.ModuleDict`` modality -> encoder module."""

    decoders: Any
    """``nn.ModuleDict`` modality -> decoder module."""

    def blocks(self) -> list[Any]:
        """The foundation's repeated transformer blocks, in order: the FSDP2, checkpointing and
        compile unit."""

    def layer_kwargs(self, layers: Any) -> dict[str, Any]:
        """The foundation's keyword arguments for encoder rows of its intermediate layers
        (``seq["layer_rows"]`` of :meth:`register_sequence_hook`, or a slice of it); ``{}`` for None."""

    def register_sequence_hook(self, hook: Any) -> Any:
        """Register ``hook(model, seq) -> seq``, called in every forward after the media embeddings
        are merged and before the foundation runs: the sharding point of sequence parallelism.

        ``seq`` holds, for the whole packed row: ``inputs_embeds`` ``[1, T, H]``; ``position_ids``
        and ``labels`` ``[1, T]`` (labels already shifted, ``-100`` where not trained);
        ``decoder_labels`` (modality -> ``[1, T]`` codes, or ``[1, T, K]`` for a decoder with ``K``
        codebooks per frame, ``-100`` elsewhere: cut and pad them along ``T``); ``cu_seqlens``
        (int32 ``[n+1]``, the packed samples' boundaries in the row, FlashAttention's varlen
        convention) and ``max_seqlen`` (int); and ``foundation_kwargs`` (extra keyword arguments of
        the foundation's forward, which transformers passes down to the attention function; with media
        spans, ``FoundationOptional.media_span_inputs``, they hold masks over the whole row, and the
        model raises when a hook cut the row); with an mRoPE foundation also ``rope_position_ids``
        ``[3, 1, T]`` (cut like ``position_ids``); and
        ``layer_inputs``, the names of the ``foundation_kwargs`` that carry encoder rows into the
        foundation's intermediate layers (``FoundationOptional.layer_inputs``; empty when none), and
        ``layer_rows``, what they were made from (None when none: ``mask`` bool ``[1, T]`` and
        ``per_layer``, one ``[mask.sum(), H]`` per layer, rows in sequence order): a hook that
        slices the sequence slices ``mask`` alike, keeps the rows of its positions and replaces
        those kwargs with :meth:`layer_kwargs` of the result (``dataclasses.replace`` of
        ``layer_rows``), or raises. A hook
        returns the same keys, possibly sliced to this rank's part of the sequence; the losses are
        then sums over that part. ``cu_seqlens`` always describes the *whole* row (attention
        wrappers that gather the sequence use it). Returns a handle whose ``remove()`` unregisters.
        """

    def register_encoder_hook(self, hook: Any) -> Any:
        """Register ``hook(model, call) -> output``, called instead of the encoder module each time
        a forward encodes a modality (``call``: an :class:`EncoderCall`): once per encoder module
        and modality it encodes, in module order, on every rank alike, whether this rank's
        micro-batch holds items of that modality (``call.batch``) or not (``call.batch`` is None).

        With a batch, return what the module returns for exactly those items (``[sum of
        num_tokens, H]`` rows in item order, or an :class:`EncoderOutput`), however computed (the
        hook may encode them on other ranks and exchange the rows; gradients must flow back the
        same way). Without one, return an output that the model adds, times 0, to the loss (as it
        does the dummy pass), so that the module's parameters and any collective in the hook's
        graph take part in the backward on every rank. The default, without hooks, is
        ``call.encode(call.batch)``, and ``call.encode(None)`` runs the dummy batch. Several hooks
        nest in registration order (the first is outermost). Returns a handle whose ``remove()``
        unregisters.
        """


@runtime_checkable
class ParallelStrategy(Protocol):
    """Applies one way of distributing the model from outside the model code (VeOmni's
    model-centric recipe; torchtitan's ``parallelize``).

    The core reads exactly these members, and no others:

    ``mesh_dims`` (required)
        The DeviceMesh dims the strategy uses (``dp_replicate``, ``dp_shard``, ``ep``, ``sp`` or
        the derived ``fsdp``, ``dp_shard_sp``). A mesh dim above size 1 that no strategy names is an
        error (its ranks would silently train apart).
    ``apply(model, state)`` (required)
        Wrap ``model`` (a :class:`ParallelModel`) in place and return it. ``state`` is the run's
        :class:`ParallelStateView` (``state.mesh`` is the ``DeviceMesh``, None on one process;
        derived dims, groups, mixed precision); the one entry point of every strategy.
    ``phase`` (optional, default ``"sharding"``)
        One of :data:`PHASES`: when the strategy is applied relative to the others.
    ``validate(model_or_config, state)`` (optional)
        ``list[Violation]``: what this layout cannot do with this model. ``omnicore plan`` calls it
        with a meta-device model and a planned state (no process group); the training run calls it
        with the real ones before anything is applied.
    ``plan(model, state, prior)`` (optional)
        A :class:`StrategyPlan` for ``omnicore plan``'s per-rank memory; ``prior`` maps a parameter
        name to the splits earlier strategies made, as ``[(dim, ways), ...]``.
    ``plan_encoder_costs(modality, module, processor, batches, flops)`` (optional)
        For a strategy that moves encoder work between data-parallel ranks (an encoder hook):
        each rank's encoder FLOPs of one encoder call as it would distribute them, which
        ``omnicore plan`` prints beside the ranks' own.

    A strategy that splits each micro-batch over several ranks (sequence parallelism) also
    implements :class:`SequenceParallel`.
    """

    mesh_dims: tuple[str, ...]
    """The DeviceMesh dims (or derived dims) this strategy uses."""

    def apply(self, model: Any, state: Any) -> Any:
        """Wrap ``model`` in place using ``state`` (a :class:`ParallelStateView`) and return it."""


class ParallelStrategyOptional(Protocol):
    """The optional members of a :class:`ParallelStrategy`, with their exact signatures. The core
    reads each with ``getattr`` and a default (:mod:`omnicore.parallel.parallelize`,
    :mod:`omnicore.parallel.plan`), so a strategy implements only those it needs."""

    phase: str
    """One of :data:`PHASES`; default :data:`DEFAULT_PHASE`."""

    def validate(self, model_or_config: Any, state: Any) -> list[Violation]:
        """Every constraint this strategy cannot meet with this model on this layout (``[]``: fine).
        ``model_or_config`` is a meta-device model in ``omnicore plan``, the real one in training;
        ``state`` may be a planned one without process groups."""

    def plan(self, model: Any, state: Any, prior: dict[str, list[tuple[str, int]]]) -> StrategyPlan:
        """What it would wrap and split (for ``omnicore plan``), given the splits of earlier
        strategies (``prior``: parameter name -> ``[(dim, ways), ...]``)."""

    def plan_encoder_costs(self, modality: str, module: Any, processor: Any, batches: list[Any], flops: Any) -> list[float] | None:
        """Each data rank's encoder FLOPs (forward + backward) of one encoder call of ``modality``
        as this strategy's encoder hook would distribute the work at run time, for ``omnicore
        plan``; None when it leaves that modality's items where they are (the plan then shows the
        ranks' own FLOPs only). ``omnicore plan`` calls it once per micro-step of step 1 and
        encoder modality, without processes: ``batches[r]`` is data rank ``r``'s collated items
        of the modality (None: none), on the CPU, what :attr:`EncoderCall.batch` holds on rank
        ``r``; ``module`` and ``processor`` are the call's (the module on the meta device);
        ``flops(batch) -> float`` counts the module's FLOPs of a collated batch (0.0 for None;
        it raises when the module cannot run on meta tensors). Returns one value per entry of
        ``batches``. The first strategy in the order applied that answers is shown."""


@runtime_checkable
class SequenceParallel(Protocol):
    """The sub-protocol of a parallel strategy whose ranks share micro-batches (Ulysses): it
    answers which data each rank reads, and usually shards the sequence in a
    :meth:`ParallelModel.register_sequence_hook` hook.

    The training loop reads ``data_split`` of the first strategy that has one: the ranks of one
    data group read the same micro-batches, and the loop divides the target and token counts by the
    replication (``world_size / count``) so that the loss stays normalised by the global count.
    That holds only if the ranks of a data group **split the targets** between them, each computing
    the loss of its own part (Ulysses slices the sequence in a sequence hook; masking the labels of
    the other ranks' part works too): every step the loop checks that the targets the model counted
    on all ranks add up to the micro-batches' count, and stops with an error otherwise.
    """

    def data_split(self, state: Any) -> tuple[int, int]:
        """``(index, count)``: this rank's data group and the number of data groups. A function of
        ``state`` alone (``omnicore plan`` asks it for every rank of a planned layout, before
        ``apply``); ``count`` divides the world size and every group has ``world_size / count``
        ranks."""


@runtime_checkable
class ParallelStateView(Protocol):
    """What a strategy may read from the ``state`` it is given (an
    :class:`omnicore.parallel.state.ParallelState`; in ``omnicore plan``, a planned stand-in with
    the same sizes and no process groups)."""

    rank: int
    """This process's global rank, ``0 <= rank < world_size``."""
    world_size: int
    """The number of processes in the run (1 without a process group)."""
    mesh: Any
    """The ``DeviceMesh`` (dims ``dp_replicate, dp_shard, ep, sp``), None on one process."""
    mixed_precision: str
    """``none`` or ``bf16`` (FSDP2 then all-gathers bf16 parameters)."""

    @property
    def distributed(self) -> bool:
        """Whether a process group is running (world size above 1)."""

    def size(self, dim: str) -> int:
        """Size of a mesh dim or derived dim (``fsdp`` = ``dp_shard x ep x sp``, ``dp_shard_sp``)."""

    def submesh(self, *dims: str) -> Any:
        """The sub-``DeviceMesh`` of these dims (a flattened one for derived dims)."""

    def fsdp_mesh(self, shard_dim: str = "fsdp") -> Any:
        """The mesh FSDP2 shards over: 1-D ``shard_dim``, or 2-D ``(dp_replicate, shard_dim)`` (HSDP)."""


@runtime_checkable
class Kernel(Protocol):
    """A compute kernel chosen per op by config (``model.kernels.<op>``).

    ``op`` names what it implements, one of ``attention``, ``rmsnorm``, ``swiglu``,
    ``cross_entropy`` (:data:`omnicore.config.KERNEL_OPS`); a kernel configured under another op's
    key is an error. ``available()`` returns ``(ok, reason)``, must be cheap, and is called for
    every configured kernel before the foundation is built; ``activate(model)`` installs the kernel
    on the built transformers model (attention, rmsnorm and swiglu kernels patch it; a
    cross_entropy kernel has nothing to install).

    A kernel of op ``cross_entropy`` also implements :class:`CrossEntropyKernel`
    (``linear_cross_entropy_sum``): OmniModel computes its text loss with it.
    """

    op: str
    """The op implemented: ``attention``, ``rmsnorm``, ``swiglu`` or ``cross_entropy``."""

    def available(self) -> tuple[bool, str]:
        """``(ok, reason)``: whether the kernel can run here (its package, a GPU); cheap, called
        before the foundation is built. ``reason`` says what is missing when ``ok`` is false."""

    def activate(self, model: Any) -> None:
        """Install the kernel on the built transformers model, in place."""


@runtime_checkable
class CrossEntropyKernel(Protocol):
    """The extra member of a kernel of op ``cross_entropy`` (see :class:`Kernel`): OmniModel
    computes its text loss with it."""

    def linear_cross_entropy_sum(self, hidden: Any, weight: Any, labels: Any, ignore_index: int = -100, bias: Any = None) -> Any:
        """Sum over the targets of ``-log softmax(hidden @ weight.T + bias)[label]``.

        ``hidden`` ``[N, H]``, ``weight`` ``[V, H]`` (possibly a DTensor), ``labels`` LongTensor
        ``[N]`` (already shifted; ``ignore_index`` rows contribute nothing), ``bias`` ``[V]`` or
        None. Returns an fp32 scalar in nats (0 when all are ignored), differentiable w.r.t.
        ``hidden``, ``weight`` and ``bias``."""


@runtime_checkable
class Logger(Protocol):
    """Where a run's metrics, validation rows and images go (TensorBoard, W&B, a file), chosen by
    ``run.loggers``.

    Built by ``factory(options)`` on rank 0 only, before step 1; several may run at once. The core
    calls :meth:`start` once, then :meth:`log_metrics` and :meth:`log_images` any number of times,
    then :meth:`close` once (also when the run stops early). A logger whose :meth:`start` raises
    stops the run before step 1 (one ``error:`` line naming ``run.loggers[i]``); one that raises in
    ``log_metrics``, ``log_images`` or ``close`` is reported once as a warning and is not called
    again (the run goes on). A logger must not import torch or its library in its hook module; its
    ``target`` module may.
    """

    def start(self, run_info: dict[str, Any]) -> None:
        """Open the logger's output for one run.

        ``run_info`` holds ``config`` (the run's config as a JSON-ready dict), ``output_dir`` (the
        run folder, a ``str``; a logger writes under it unless its options say otherwise),
        ``run_name`` (the output folder's name), ``resume`` (True when the run continues from a
        checkpoint: append rather than start afresh) and ``start_step`` (steps already done; on a
        resume, drop what was stored for later steps: an interrupted run may have logged steps it
        never saved, and they are logged again).
        Raise (any exception, with a message that says what to fix) if the logger cannot work."""

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        """Record one metrics row at optimizer step ``step`` (1-based: the steps done).

        ``row`` maps names to ``float``, ``int``, ``bool``, ``str`` or ``None`` (a figure the
        device cannot give, such as MFU on CPU); a float may be NaN or inf (a skipped step).
        ``split`` is ``"train"`` for training rows and ``"val"`` for validation rows; a logger
        keeps the splits apart (TensorBoard: tags ``train/<name>`` and ``val/<name>``)."""

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        """Record images at step ``step`` under ``name`` (such as ``samples/image``): each a numpy
        ``uint8`` array of shape ``[H, W, 3]`` (RGB). A logger that cannot store images does
        nothing."""

    def close(self) -> None:
        """Flush and release everything; called once, at the end of the run or when it stops."""


CONTRACTS: dict[str, tuple[type, ...]] = {
    "encoder": (Encoder,),
    "decoder": (Decoder,),
    "processor": (Processor,),
    "foundation": (Foundation, FoundationOptional),
    "parallel": (ParallelStrategy, ParallelStrategyOptional, SequenceParallel),
    "kernel": (Kernel, CrossEntropyKernel),
    "logger": (Logger,),
}
"""The protocols that make up each kind's contract (required first, then optional or per-op parts);
``processor`` is the data side of encoders and decoders (``ComponentSpec.processor``)."""


def contract_members(kind: str) -> set[str]:
    """Every member name the core may read from a component of ``kind`` (the union of
    :data:`CONTRACTS`' protocols: attributes and methods).

    Raises:
        KeyError: ``kind`` is not one of :data:`CONTRACTS` (:data:`KINDS` and ``processor``).
    """
    out: set[str] = set()
    for proto in CONTRACTS[kind]:
        out |= set(vars(proto).get("__annotations__", {}))
        out |= {n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")}
    return out
