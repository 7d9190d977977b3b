"""Component specs and the contract each kind of component implements.

This module is imported by ``omnicore plugins`` and by every plugin's hook module, so it must stay
torch-free: the contracts below are ``typing.Protocol`` classes that only *name* tensor types in
strings.

A plugin's hook returns light :class:`ComponentSpec` objects. Nothing heavy is imported until a
component is built: the spec's ``target`` is a ``"module:attr"`` string that the registry resolves
lazily (see :meth:`omnicore.registry.Registry.build`).

The five kinds and what their ``target`` factory must return:

========== ================================================ ===========================================
kind       factory signature                                returns
========== ================================================ ===========================================
encoder    ``factory(options: dict, *, hidden_size: int)``  an ``nn.Module`` implementing :class:`Encoder`
decoder    ``factory(options: dict, *, hidden_size: int)``  an ``nn.Module`` implementing :class:`Decoder`
foundation ``factory(options: dict)``                       an object implementing :class:`Foundation`
parallel   ``factory(options: dict)``                       an object implementing :class:`ParallelStrategy`
kernel     ``factory(options: dict)``                       an object implementing :class:`Kernel`
========== ================================================ ===========================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

KINDS: tuple[str, ...] = ("encoder", "decoder", "foundation", "parallel", "kernel")
"""The five component kinds, in the order ``omnicore plugins`` lists them."""


@dataclass(frozen=True)
class ComponentSpec:
    """What a plugin registers: a light, import-free description of one component.

    Attributes:
        kind: one of :data:`KINDS`.
        name: the name users write in config (``encoders: {audio: {name: whisper}}``). Lower case,
            letters, digits, ``_`` and ``-``.
        target: ``"package.module:factory"``, imported only when the component is built.
        description: one line for ``omnicore plugins``.
        modalities: for encoders and decoders, the modalities handled (``("audio",)``).
        requires: capabilities the component needs at build time, e.g. ``("cuda",)``.
        options_model: optional ``"module:Class"`` of a pydantic model that validates the
            component's ``options`` from config (imported lazily, at build time).

    Raises:
        ValueError: on construction, if ``kind`` is unknown, ``name`` is empty or ``target`` is not
            of the form ``module:attr``.
    """

    kind: str
    name: str
    target: str
    description: str = ""
    modalities: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    options_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ComponentSpec kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.name or not all(c.isalnum() or c in "_-" for c in self.name):
            raise ValueError(
                f"ComponentSpec name {self.name!r} must be non-empty and use only letters, digits, '_' and '-'"
            )
        if ":" not in self.target or self.target.startswith(":") or self.target.endswith(":"):
            raise ValueError(f"ComponentSpec {self.kind}/{self.name}: target {self.target!r} must be 'module:attr'")

    @property
    def key(self) -> str:
        """``kind/name``, the string used in messages and in ``omnicore plugins``."""
        return f"{self.kind}/{self.name}"


# --------------------------------------------------------------------------------------------
# Contracts. Tensor shapes use: B = items in a batch of one modality, T = tokens, H = the
# foundation's hidden size, C = codebook size.
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Encoder(Protocol):
    """An input-side modality encoder (VeOmni's ``lm_encode``): media to ``H``-wide embeddings.

    An encoder is an ``nn.Module`` whose output is already projected to the foundation's hidden size
    ``H`` (the factory receives ``hidden_size``). The data side and the model share one formula for
    the number of placeholder tokens: :meth:`num_tokens`.
    """

    modality: str
    """``"image"``, ``"audio"``, ..."""

    def preprocess(self, media: Any) -> dict[str, Any]:
        """Turn one loaded medium into CPU features (runs in data workers, no gradients).

        ``media`` is a ``PIL.Image.Image`` for images and an :class:`omnicore.data.media.Audio`
        (float32 samples in [-1, 1], shape ``[num_samples]``, and ``sample_rate`` in Hz) for audio.
        Returns a dict of tensors for one item (no batch dim).
        """

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Number of placeholder tokens (and of output embeddings) for one item's features."""

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Batch a list of per-item feature dicts (in order) for :meth:`forward`."""

    def forward(self, batch: dict[str, Any]) -> Any:
        """Encode a collated batch: returns ``[sum(num_tokens(item)), H]`` in item order."""

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
    """

    modality: str
    codebook_size: int

    def preprocess(self, media: Any) -> dict[str, Any]:
        """Turn one loaded target medium into CPU features (see :meth:`Encoder.preprocess`)."""

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Number of code positions the target occupies in the sequence."""

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Batch a list of per-item feature dicts (in order)."""

    def encode(self, batch: dict[str, Any]) -> Any:
        """Target features to codes: LongTensor ``[sum(num_tokens(item))]`` in item order, no grad."""

    def embed(self, codes: Any) -> Any:
        """Codes ``[N]`` (long) to input embeddings ``[N, H]``."""

    def head(self, hidden: Any) -> Any:
        """Hidden states ``[N, H]`` to codebook logits ``[N, C]``."""

    def decode(self, codes: Any) -> Any:
        """Codes of one item ``[num_tokens]`` back to the medium (a ``PIL.Image.Image`` for images)."""

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
    """

    def build_tokenizer(self) -> Any: ...

    def build_model(self, vocab_size: int) -> Any: ...


@runtime_checkable
class ParallelStrategy(Protocol):
    """Applies a way of distributing the model, from outside the model code.

    ``mesh_dims`` names the DeviceMesh dims the strategy uses; ``apply`` wraps the model in place
    (for example FSDP2's ``fully_shard`` per block) and returns it.
    """

    mesh_dims: tuple[str, ...]

    def apply(self, model: Any, mesh: Any) -> Any: ...


@runtime_checkable
class Kernel(Protocol):
    """A compute kernel chosen per op by config (``model.kernels.<op>``; ``model.attention`` is the
    shorthand for ``model.kernels.attention``).

    ``op`` names what it implements, one of ``attention``, ``rmsnorm``, ``swiglu``,
    ``cross_entropy`` (:data:`omnicore.config.KERNEL_OPS`); a kernel configured under another op's
    key is an error. ``available()`` returns ``(ok, reason)``, must be cheap, and is called for
    every configured kernel before the foundation is built; ``activate(model)`` installs the kernel
    on the built transformers model (attention, rmsnorm and swiglu kernels patch it; a
    cross_entropy kernel has nothing to install).

    A kernel of op ``cross_entropy`` also has
    ``linear_cross_entropy_sum(hidden, weight, labels, ignore_index=-100, bias=None)``: ``hidden``
    ``[N, H]`` (final hidden states), ``weight`` ``[V, H]`` (the LM head, possibly tied to the
    embeddings), ``labels`` LongTensor ``[N]`` (already shifted, ``ignore_index`` where not
    trained), ``bias`` ``[V]`` or None; returns the fp32 scalar SUM over targets of
    ``-log softmax(hidden @ weight.T + bias)[label]`` (nats; 0 when all are ignored), differentiable
    w.r.t. ``hidden``, ``weight`` and ``bias``. OmniModel computes its text loss with it.
    """

    op: str

    def available(self) -> tuple[bool, str]: ...

    def activate(self, model: Any) -> None: ...
