"""Built-in RMSNorm kernel (op ``rmsnorm``): ``torch_rms_norm``, the foundation's RMSNorm modules
computed with ``torch.nn.functional.rms_norm``."""

from __future__ import annotations

from typing import Any


def _torch_rms_norm_forward(self: Any, hidden_states: Any) -> Any:
    """HF's RMSNorm as ``F.rms_norm`` in fp32: ``weight * (x / sqrt(mean(x^2) + eps)).to(dtype)``."""
    import torch

    dtype = hidden_states.dtype
    normed = torch.nn.functional.rms_norm(hidden_states.float(), hidden_states.shape[-1:], None, self._omnicore_rms_eps)
    return self.weight * normed.to(dtype)


_RMS_CLASSES: dict[type, type] = {}


def rms_norm_modules(model: Any) -> list[Any]:
    """The modules of ``model`` that look like HF RMSNorms: class name ending in ``RMSNorm``, a
    ``weight`` tensor and an ``eps`` or ``variance_epsilon`` float."""
    out = []
    for m in model.modules():
        if not type(m).__name__.endswith("RMSNorm") or getattr(m, "weight", None) is None:
            continue
        if isinstance(getattr(m, "variance_epsilon", getattr(m, "eps", None)), (int, float)):
            out.append(m)
    return out


class TorchRMSNorm:
    """The foundation's RMSNorm modules compute with ``torch.nn.functional.rms_norm`` (fp32, cast
    back to the input dtype, then times ``weight``), as transformers' Llama/Qwen2-style RMSNorm does
    with explicit ``pow``/``mean``/``rsqrt``; equal to it within fp32 rounding, and a fused kernel
    where torch has one.

    ``activate`` swaps each matching module's class (see :func:`rms_norm_modules`) for a subclass
    whose ``forward`` is the one above; parameters, state-dict keys and ``save_pretrained`` output
    are unchanged. Before swapping a class it checks on a probe input that the new forward equals
    the module's own (so variants such as Gemma's ``1 + weight`` scaling are refused, not silently
    changed).

    Raises:
        ValueError: from ``activate``, when the model has no RMSNorm modules, or a class's forward
            differs from ``F.rms_norm`` on the probe (the message names the class).
    """

    op = "rmsnorm"
    probe_rtol = 1e-4

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def available(self) -> tuple[bool, str]:
        return True, "pure PyTorch (torch.nn.functional.rms_norm); runs on CPU and GPU"

    def activate(self, model: Any) -> None:
        import torch

        mods = rms_norm_modules(model)
        if not mods:
            raise ValueError(
                f"torch_rms_norm: {type(model).__name__} has no RMSNorm modules (class name ending in 'RMSNorm' with weight and eps)"
            )
        checked: set[type] = set()
        for m in mods:
            cls = type(m)
            if cls in _RMS_CLASSES.values():
                continue  # already swapped
            m._omnicore_rms_eps = float(getattr(m, "variance_epsilon", getattr(m, "eps", None)))
            if cls not in checked and m.weight.device.type != "meta":
                gen = torch.Generator().manual_seed(0)
                x = torch.randn(3, m.weight.shape[-1], generator=gen).to(m.weight.device)
                with torch.no_grad():
                    want = m(x).float()
                    got = _torch_rms_norm_forward(m, x).float()
                if not torch.allclose(got, want, rtol=self.probe_rtol, atol=self.probe_rtol):
                    raise ValueError(
                        f"torch_rms_norm: {cls.__name__}.forward differs from weight * rms_norm(x) (max |diff| "
                        f"{(got - want).abs().max().item():.3g} on a probe); this kernel does not fit {cls.__name__}"
                    )
                checked.add(cls)
            if cls not in _RMS_CLASSES:
                _RMS_CLASSES[cls] = type(f"Torch{cls.__name__}", (cls,), {"forward": _torch_rms_norm_forward, "__module__": __name__})
            m.__class__ = _RMS_CLASSES[cls]
