"""Built-in text-loss kernels (op ``cross_entropy``): ``torch_cross_entropy`` (the default: whole
fp32 logits) and ``chunked_cross_entropy`` (LM head and loss in row chunks, gradients in forward).

This module imports pydantic but not torch at import time: torch is imported inside the methods.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from omnicore.kernels.common import plain_weight


class TorchCrossEntropy:
    """The reference text loss: the whole ``[N, V]`` logits, cast to fp32, then
    ``F.cross_entropy(reduction="sum")``. What :class:`omnicore.model.omni.OmniModel` always computed
    (bit for bit); its memory is ``O(N * V)`` (fp32 logits plus their gradient)."""

    op = "cross_entropy"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def available(self) -> tuple[bool, str]:
        return True, "pure PyTorch; runs on CPU and GPU"

    def activate(self, model: Any) -> None:
        """Nothing to install: :class:`~omnicore.model.omni.OmniModel` calls
        :meth:`linear_cross_entropy_sum` for its text loss."""

    def linear_cross_entropy_sum(self, hidden: Any, weight: Any, labels: Any, ignore_index: int = -100, bias: Any = None) -> Any:
        """Sum over the targets of ``-log softmax(hidden @ weight.T + bias)[label]``.

        Args:
            hidden: ``[N, H]`` final hidden states (any float dtype; the matmul runs in it, or in
                autocast's dtype).
            weight: ``[V, H]`` LM head weight (tied embeddings are fine; a DTensor is gathered).
            labels: LongTensor ``[N]``, already shifted; ``ignore_index`` rows contribute nothing.
            bias: optional ``[V]`` head bias.

        Returns:
            fp32 scalar: the summed loss in nats (0 when every label is ignored).
        """
        import torch.nn.functional as F

        logits = F.linear(hidden, plain_weight(weight), bias).float()
        return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")


class ChunkedCrossEntropyOptions(BaseModel):
    """Options of ``kernel/chunked_cross_entropy``."""

    model_config = ConfigDict(extra="forbid")

    chunk_size: int = Field(
        default=1024, gt=0, description="rows (tokens) per chunk; the extra memory is about chunk_size x vocab x 4 bytes (fp32 logits)"
    )


def _compute_dtype(t: Any) -> Any:
    """The dtype a ``linear`` on ``t`` runs in here: autocast's when it is on, else ``t``'s own."""
    import torch

    dev = t.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return t.dtype


def _chunked_forward(
    hidden: Any, weight: Any, bias: Any, labels: Any, ignore_index: int, chunk: int, need: tuple[bool, bool, bool]
) -> tuple[Any, Any, Any, Any]:
    """Loss sum and, where ``need`` asks (hidden, weight, bias), its gradients, chunk by chunk.

    For the rows ``i`` of a chunk, logits ``z_i = h_i W^T + b`` (computed in the compute dtype,
    then fp32) and target ``y_i``: ``loss_i = logsumexp(z_i) - z_i[y_i]`` and ``dloss_i/dz_i =
    softmax(z_i) - onehot(y_i)`` (0 for ignored rows), so ``dh_i = dz_i W``, ``dW += dz^T h`` and
    ``db += sum_i dz_i``. One chunk's ``[c, V]`` fp32 logits exist at a time and are overwritten in
    place by their gradient. The matmuls run in the compute dtype (autocast's, or the inputs');
    the loss, ``dz`` and the ``dW``/``db`` accumulators are fp32.
    """
    import torch

    need_h, need_w, need_b = need
    cd = _compute_dtype(hidden)
    n = hidden.shape[0]
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
    grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
    with torch.autocast(hidden.device.type, enabled=False):
        w = weight.to(cd)
        b = bias.to(cd) if bias is not None else None
        for start in range(0, n, chunk):
            h = hidden[start : start + chunk].to(cd)
            y = labels[start : start + chunk]
            z = torch.nn.functional.linear(h, w, b).float()  # [c, V]
            valid = y != ignore_index
            safe = torch.where(valid, y, torch.zeros_like(y))
            lse = torch.logsumexp(z, dim=-1)
            target = z.gather(1, safe.unsqueeze(1)).squeeze(1)
            loss += torch.where(valid, lse - target, torch.zeros_like(lse)).sum()
            if not any(need):
                continue
            # z becomes dloss/dz in place: softmax - onehot on valid rows, 0 on ignored ones
            keep = valid.to(z.dtype).unsqueeze(1)
            z.sub_(lse.unsqueeze(1)).exp_()
            z.scatter_add_(1, safe.unsqueeze(1), -keep)
            z.mul_(keep)
            if need_b:
                grad_b += z.sum(0)
            g = z if cd == torch.float32 else z.to(cd)
            if need_h:
                grad_h[start : start + chunk] = g @ w
            if need_w:
                if cd == torch.float32:
                    grad_w.addmm_(g.t(), h)
                else:
                    grad_w += (g.t() @ h).float()  # this chunk's product in the compute dtype, summed in fp32
            del z, g
    return loss, grad_h, grad_w, grad_b


def _chunked_function() -> Any:
    """The ``torch.autograd.Function`` (defined lazily: this module does not import torch)."""
    global _ChunkedLinearCE
    if _ChunkedLinearCE is not None:
        return _ChunkedLinearCE
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        """Forward computes the loss and the gradients (see :func:`_chunked_forward`); backward
        only scales the stored gradients by the incoming scalar gradient."""

        @staticmethod
        def forward(ctx, hidden, weight, bias, labels, ignore_index, chunk, need):  # noqa: ANN001
            loss, gh, gw, gb = _chunked_forward(hidden, weight, bias, labels, ignore_index, chunk, need)
            ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
            ctx.save_for_backward(gh, gw, gb)
            return loss

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_out):  # noqa: ANN001
            gh, gw, gb = ctx.saved_tensors
            dh, dw, db = ctx.dtypes
            scale = grad_out.float()
            out = [None if g is None else (g * scale).to(d) for g, d in ((gh, dh), (gw, dw), (gb, db))]
            return out[0], out[1], out[2], None, None, None, None

    _ChunkedLinearCE = ChunkedLinearCrossEntropy
    return _ChunkedLinearCE


_ChunkedLinearCE: Any = None


class ChunkedCrossEntropy(TorchCrossEntropy):
    """Text loss without the whole ``[N, V]`` logits: rows in chunks, gradients computed in forward.

    The algorithm of Liger Kernel's fused linear cross-entropy (Hsu et al. 2024, "Liger Kernel:
    Efficient Triton Kernels for LLM Training", arXiv:2410.10989) in pure PyTorch: for each chunk of
    ``chunk_size`` rows, compute the chunk's logits, its loss and at once its gradient
    ``softmax - onehot``, fold that into the gradients of the hidden states and the head weight,
    and drop the logits. Wijmans et al. 2024 ("Cut Your Losses in Large-Vocabulary Language
    Models", arXiv:2411.09009) analyse the same memory problem (they go further, blocking over the
    vocabulary as well and recomputing in backward). Memory: ``O(chunk_size * V)`` for the logits
    instead of ``O(N * V)``, plus one ``[N, H]`` gradient and a ``[V, H]`` fp32 accumulator kept
    from forward to backward. Results equal :class:`TorchCrossEntropy` within fp32 rounding.

    The gradients are computed in forward only when autograd needs them (grad mode on and an input
    that requires grad); under ``torch.no_grad()`` this is a chunked loss only.
    """

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self.chunk_size = int(self.options.get("chunk_size", 1024))
        if self.chunk_size <= 0:
            raise ValueError(f"chunked_cross_entropy: chunk_size must be positive, got {self.chunk_size}")

    def linear_cross_entropy_sum(self, hidden: Any, weight: Any, labels: Any, ignore_index: int = -100, bias: Any = None) -> Any:
        """As :meth:`TorchCrossEntropy.linear_cross_entropy_sum` (same shapes, fp32 scalar sum).

        Raises:
            ValueError: ``hidden`` is not ``[N, H]``, ``weight`` not ``[V, H]`` or ``labels`` not ``[N]``.
        """
        import torch

        weight = plain_weight(weight)
        if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] or labels.shape != hidden.shape[:1]:
            raise ValueError(
                f"chunked_cross_entropy: expected hidden [N, H], weight [V, H], labels [N]; got {tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(labels.shape)}"
            )
        grad = torch.is_grad_enabled()
        need = (grad and hidden.requires_grad, grad and weight.requires_grad, grad and bias is not None and bias.requires_grad)
        if not any(need):
            return _chunked_forward(hidden, weight, bias, labels, ignore_index, self.chunk_size, need)[0]
        return _chunked_function().apply(hidden, weight, bias, labels, ignore_index, self.chunk_size, need)
