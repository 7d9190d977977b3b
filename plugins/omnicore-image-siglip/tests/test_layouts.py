"""The einops patch merge gives bit for bit the tensor of the reshape/permute expression it
replaced, written here as the reference."""

from __future__ import annotations

import pytest
import torch

from omnicore_image_siglip.encoder import merge_patches


def _old_merge_patches(hidden: torch.Tensor, side: int, merge: int) -> torch.Tensor:
    b, _, d = hidden.shape
    g = side // merge
    blocks = hidden.reshape(b, g, merge, g, merge, d).permute(0, 1, 3, 2, 4, 5)  # [B, g, g, m, m, D]
    return blocks.reshape(b, g * g, merge * merge * d)


@pytest.mark.parametrize(("b", "side", "merge", "d"), [(1, 4, 2, 8), (3, 6, 2, 5), (2, 6, 3, 4), (2, 4, 1, 7), (1, 8, 4, 2)])
def test_merge_patches_equals_the_reshape_permute_expression(b, side, merge, d):
    hidden = torch.randn(b, side * side, d, generator=torch.Generator().manual_seed(side * merge + d))
    got = merge_patches(hidden, side, merge)
    want = _old_merge_patches(hidden, side, merge)
    assert got.shape == want.shape == (b, (side // merge) ** 2, merge * merge * d)
    assert torch.equal(got, want)
    # block (0, 0) holds the patches (0, 0), (0, 1), (1, 0), (1, 1) of the raster, each D wide (the docstring's order)
    if merge == 2:
        assert torch.equal(got[:, 0], torch.cat([hidden[:, 0], hidden[:, 1], hidden[:, side], hidden[:, side + 1]], dim=-1))
    assert torch.equal(merge_patches(hidden.bfloat16(), side, merge), want.bfloat16())
