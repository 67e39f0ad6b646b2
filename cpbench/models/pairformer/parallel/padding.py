"""Padding and masks: N is padded to a multiple of the CP size; padded tokens are masked.

The features themselves are padded by ``cpbench.data.sharding.pad_features`` (with
``token_multiple=token_multiple(...)``); this module owns what the trunk derives from the mask.

The pair mask is the outer product of the token mask (as in AF3 / Boltz-2), so the only mask
an op needs is the global token mask ``[N_pad]`` (O(N), replicated on every rank).
"""

from __future__ import annotations

import math

import torch

# Added to attention logits of masked keys; finite so a bf16 bias stays finite, large enough
# that exp() underflows to exactly 0 in fp32 and bf16.
MASKED_LOGIT = -1.0e9


def token_multiple(cp: int, device: torch.device) -> int:
    """Tokens are padded to a multiple of this: the CP size, and on CUDA also 16, since the
    fused attention kernels pad a misaligned bias (a copy of the whole N x N x heads bias); on a
    CPU also 8: an N off a multiple of 8 costs the CPU kernels more memory than the next multiple
    (the tiny trunk under a 0.125 GiB cap: N=915 and 979 ran out of memory where 912, 920, 928,
    960 and 976 fit), so without it the max N a probe finds depends on which N it tried."""
    return math.lcm(cp, 16) if device.type == "cuda" else math.lcm(cp, 8)


def key_bias(token_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention bias over keys: 0 on real tokens, ``MASKED_LOGIT`` on masked ones.

    Args:
        token_mask: ``[N_pad]`` bool.
    Returns:
        ``[N_pad]`` in ``dtype``.
    """
    return (~token_mask).to(dtype) * MASKED_LOGIT


def pair_mask(token_mask: torch.Tensor, rows: slice, dtype: torch.dtype, cols: slice = slice(None)) -> torch.Tensor:
    """Pair mask of the rows ``rows`` (and columns ``cols``, 2d): ``[len(rows), len(cols), 1]``
    in ``dtype`` (1 real, 0 masked)."""
    m = token_mask.to(dtype)
    return (m[rows, None] * m[None, cols])[..., None]
