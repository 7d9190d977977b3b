"""Random augmentation of video clips, applied by the encoder while it trains.

A vision tower trained from scratch on a few thousand clips learns their training set rather than
the task (Touvron et al., DeiT, ICML 2021, on ViTs and little data; in the digits example's
Moving MNIST probe, a tower plus a linear layer reached 0.42 held-out accuracy on the first digit
after 800 steps of 16 clips from 2,000 clips, and 0.50 with the shifts and reversals below). Two
changes are drawn per clip, the same for all its frames:

* ``shift``: a translation of every frame by up to ``shift`` of the frame's height and width
  (bilinear, pixels from outside the frame repeat its border, so a uniform background stays so);
* ``reverse``: with probability 1/2, the frames in reverse order. Only for tasks whose answer does
  not depend on the direction of time (which objects appear, what they look like); off by default.

Clips arrive as tubelet patches (:meth:`VideoFramesProcessor.patchify`'s layout), so they are
turned back into frames (:func:`patches_to_frames`), changed, and cut again
(:func:`frames_to_patches`). The encoder applies this only in training mode (``module.training``):
validation, ``omnicore eval`` and generation see the clips unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["VideoAugmentOptions", "augment_clips", "frames_to_patches", "patches_to_frames"]


class VideoAugmentOptions(BaseModel):
    """The ``augment`` option of encoder ``video_frames`` (none by default).

    Example (Moving MNIST, where the digits' order left to right is the answer)::

        augment: {shift: 0.05, reverse: true}
    """

    model_config = ConfigDict(extra="forbid")

    shift: float = Field(default=0.0, ge=0.0, le=0.5, description="largest translation, as a fraction of the frame's height and width")
    reverse: bool = Field(
        default=False, description="play each clip backwards with probability 1/2 (only where time's direction does not matter)"
    )

    @property
    def active(self) -> bool:
        """Whether any change is drawn at all."""
        return self.shift > 0 or self.reverse


def patches_to_frames(patches: torch.Tensor, grid: tuple[int, int, int], tp: int, p: int, m: int) -> torch.Tensor:
    """One clip's patches ``[gt * gh * gw, C * tp * P * P]`` back to frames ``[gt * tp, C, gh * P, gw * P]``
    (the inverse of :meth:`~omnicore_video_frames.processor.VideoFramesProcessor.patchify`)."""
    gt, gh, gw = grid
    # bh, bw: the m x m block's row and column; mh, mw: the patch's in its block; ph, pw: the pixel's in its patch
    pattern = "(gt bh bw mh mw) (c tp ph pw) -> (gt tp) c (bh mh ph) (bw mw pw)"
    return rearrange(patches, pattern, gt=gt, bh=gh // m, bw=gw // m, mh=m, mw=m, tp=tp, ph=p, pw=p)


def frames_to_patches(frames: torch.Tensor, tp: int, p: int, m: int) -> torch.Tensor:
    """Frames ``[gt * tp, C, S_h, S_w]`` to patches ``[gt * gh * gw, C * tp * P * P]`` in
    :meth:`~omnicore_video_frames.processor.VideoFramesProcessor.patchify`'s layout."""
    pattern = "(gt tp) c (bh mh ph) (bw mw pw) -> (gt bh bw mh mw) (c tp ph pw)"  # the names of patches_to_frames
    return rearrange(frames, pattern, tp=tp, mh=m, ph=p, mw=m, pw=p)


def augment_clips(
    pixels: torch.Tensor,
    grids: torch.Tensor,
    options: VideoAugmentOptions,
    *,
    tp: int,
    p: int,
    m: int,
    generator: torch.Generator | list[torch.Generator] | None = None,
    still: torch.Tensor | None = None,
    still_options: VideoAugmentOptions | None = None,
) -> torch.Tensor:
    """Each clip of a collated batch shifted and (maybe) reversed at random.

    Args:
        pixels: ``pixel_values_videos`` ``[sum N_b, C * tp * P * P]``, clips back to back.
        grids: ``video_grid_thw`` ``[B, 3]``.
        options: what to draw (:class:`VideoAugmentOptions`).
        tp, p, m: the tubelet's frames, the patch side (pixels), the merge size.
        generator: random numbers: one generator (default: torch's global one), or one per clip
            (:func:`omnicore.api.item_generators`: each clip's draws from its own sample's stream).
        still: bool ``[B]``, which items are still images (``second_per_grid_ts`` 0); those get
            ``still_options`` instead of ``options`` (default: every item gets ``options``).
        still_options: what to draw for still images.

    Returns:
        a new tensor of the same shape, dtype and device; ``pixels`` itself when nothing is active.
        A reversed clip whose last tubelet repeated its last frame now starts with that frame twice.
    """
    still_options = still_options or options
    flags = still.tolist() if still is not None else [False] * grids.shape[0]
    if not options.active and not (still_options.active and any(flags)):
        return pixels
    out, start = [], 0
    gens = generator if isinstance(generator, list) else [generator] * len(flags)
    for g, is_still, gen in zip(grids.tolist(), flags, gens):
        n = g[0] * g[1] * g[2]
        opts = still_options if is_still else options
        frames = patches_to_frames(pixels[start : start + n], tuple(g), tp, p, m)
        start += n
        if opts.reverse and float(torch.rand((), generator=gen)) < 0.5:
            frames = frames.flip(0)
        if opts.shift > 0:
            dx, dy = ((torch.rand(2, generator=gen) * 2 - 1) * opts.shift).tolist()
            # affine_grid maps output to input coordinates (normalised to [-1, 1]): content moves by +2 * (dx, dy)
            theta = torch.tensor([[1.0, 0.0, -2 * dx], [0.0, 1.0, -2 * dy]], device=frames.device).expand(frames.shape[0], 2, 3)
            grid = F.affine_grid(theta, list(frames.shape), align_corners=False)
            frames = F.grid_sample(frames.float(), grid, mode="bilinear", padding_mode="border", align_corners=False).to(pixels.dtype)
        out.append(frames_to_patches(frames, tp, p, m))
    return torch.cat(out)
