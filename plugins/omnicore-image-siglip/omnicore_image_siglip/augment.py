"""Random affine augmentation of a pixel batch, applied by the encoder while it trains.

Small random translations, rotations and scalings of the input are the classic augmentation for
handwritten digits (LeCun, Bottou, Bengio, Haffner, "Gradient-based learning applied to document
recognition", Proc. IEEE 1998, section III: "distortions"; Simard, Steinkraus, Platt, "Best
practices for convolutional neural networks applied to visual document analysis", ICDAR 2003) and
the standard one for ViTs trained on little data (Touvron et al., DeiT, ICML 2021). They are drawn
per image on the model's device with torch's own ``affine_grid`` and ``grid_sample``; pixels that
come from outside the image repeat its border (``padding_mode="border"``), so a digit on a uniform
background keeps that background.

The encoder applies it only in training mode (``module.training``): validation, ``omnicore eval``
and generation (which put the model in eval mode) see the images unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AugmentOptions", "random_affine", "affine_matrices"]


class AugmentOptions(BaseModel):
    """The ``augment`` option of encoder ``siglip``: the largest random change per image (each is
    drawn uniformly from ``[-max, max]``; 0 turns it off).

    Example (digits)::

        augment: {shift: 0.1, rotate: 10, scale: 0.1}
    """

    model_config = ConfigDict(extra="forbid")

    shift: float = Field(default=0.0, ge=0.0, le=0.5, description="translation, as a fraction of the image side (0.1 = 10%)")
    rotate: float = Field(default=0.0, ge=0.0, le=180.0, description="rotation, degrees")
    scale: float = Field(default=0.0, ge=0.0, lt=1.0, description="relative zoom (0.1: 0.9x to 1.1x)")

    @property
    def active(self) -> bool:
        """Whether any change is drawn at all."""
        return self.shift > 0 or self.rotate > 0 or self.scale > 0


def affine_matrices(shift: torch.Tensor, angle: torch.Tensor, zoom: torch.Tensor) -> torch.Tensor:
    """``[B, 2, 3]`` matrices for ``F.affine_grid`` that move image content by ``shift`` ``[B, 2]``
    (x, y as fractions of the side; positive: right, down), rotate it by ``angle`` ``[B]`` (radians;
    angles are drawn symmetric about 0, so the direction does not matter) and zoom it by ``zoom``
    ``[B]`` (> 1 enlarges), about the centre.

    ``affine_grid`` maps output coordinates to input ones, so the matrix is the inverse of the
    content's motion: output point ``p`` samples the input at ``R (p - 2 * shift) / zoom`` with
    ``R`` a rotation by ``angle`` (normalised coordinates span [-1, 1], hence the factor 2).
    """
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # [B, 2, 2]
    offset = -(rot @ (2 * shift).unsqueeze(-1))  # [B, 2, 1]: R (p - 2 s) / zoom = rot p + offset
    return torch.cat([rot, offset], dim=-1)


def random_affine(
    pixels: torch.Tensor, options: AugmentOptions, generator: torch.Generator | list[torch.Generator] | None = None
) -> torch.Tensor:
    """Each image of ``pixels`` ``[B, C, S, S]`` moved, rotated and zoomed at random (bilinear).

    Args:
        pixels: a float batch, any device and dtype.
        options: the largest change of each kind (:class:`AugmentOptions`).
        generator: random numbers: one generator for the batch (default: torch's global one), or
            one per image (:func:`omnicore.api.item_generators`: each image's draws from its own
            sample's stream, whatever batch or rank it is in).

    Returns:
        a new tensor of the same shape, dtype and device; ``pixels`` itself when nothing is active.
    """
    if not options.active:
        return pixels
    b = pixels.shape[0]
    if isinstance(generator, list):  # per image: shift x, shift y, angle, zoom from its own generator
        u = (torch.stack([torch.rand(4, generator=g) for g in generator]) * 2 - 1).to(pixels.device, torch.float32)
        shift, angle, zoom = u[:, :2] * options.shift, u[:, 2] * math.radians(options.rotate), 1 + u[:, 3] * options.scale
    else:

        def uniform(*shape: int) -> torch.Tensor:
            return (torch.rand(*shape, generator=generator) * 2 - 1).to(pixels.device, torch.float32)

        shift = uniform(b, 2) * options.shift
        angle = uniform(b) * math.radians(options.rotate)
        zoom = 1 + uniform(b) * options.scale
    theta = affine_matrices(shift, angle, zoom)
    grid = F.affine_grid(theta, list(pixels.shape), align_corners=False)
    out = F.grid_sample(pixels.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.to(pixels.dtype)
