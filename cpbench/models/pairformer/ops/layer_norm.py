"""LayerNorm that stays correct on CUDA at 2**32 elements and beyond.

ATen's vectorized CUDA LayerNorm computes each row's offset as ``blockIdx.x * N`` in 32 bits, so
an input of 2**32 elements or more comes out partly wrong (github.com/pytorch/pytorch/issues/181555;
the fix, pull request 181600, came after the torch 2.11 of the GPU machines). On one H200 (torch 2.11, 2026-12-03) it made
the emulated 2x2 trunk step at N=33,026 non-finite: ``scripts/nan_hunt.py`` found
``blocks.0.attention.norm_z`` returning NaN from a finite chunk of z rows
(docs/benchmarks/2026-12-03-h200-curve2/nan). Every LayerNorm of the reference model goes through
``layer_norm`` (the ``LayerNorm`` module, and the functions of ``ops/fused.py``): an eager call on
``MAX_ELEMENTS`` or more runs over pieces of its leading dimension (no copy of the input; the
output is written piece by piece, or concatenated under autograd). Inside a compiled region
inductor generates its own kernels (64-bit indexing where the sizes need it) and the call is
left whole.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MAX_ELEMENTS = 2**31  # half the failing size: the margin costs nothing (pieces of >= 2**31 elements)


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm``, in pieces of ``x``'s leading dimension when ``x`` has ``MAX_ELEMENTS``
    elements or more (eager only). Shapes: any ``x: [..., *normalized_shape]``, output alike."""
    if x.numel() < MAX_ELEMENTS or x.dim() <= len(normalized_shape) or torch.compiler.is_compiling():
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    per_row = math.prod(x.shape[1:])
    step = max(1, MAX_ELEMENTS // per_row)
    pieces = range(0, x.shape[0], step)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return torch.cat([F.layer_norm(x[i:i + step], normalized_shape, weight, bias, eps) for i in pieces])
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for i in pieces:
        out[i:i + step] = F.layer_norm(x[i:i + step], normalized_shape, weight, bias, eps)
    return out


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state dict) computed by ``layer_norm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
