"""Transition (AF3 Algorithm 11): LayerNorm, SwiGLU with ``factor·c`` hidden channels, project.

Pointwise over tokens / pairs, so every layout runs it on its local shard without communication.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cpbench.models.pairformer.ops.fused import swiglu_transition
from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.parallel import chunking


class Transition(nn.Module):
    """``x + W_out(silu(W_a LN(x)) * W_b LN(x))``.

    ``forward(x)``: ``x: [rows, ..., c]`` any local shard (``z: [N/P, N, c_z]`` or
    ``s: [N/P, c_s]``); chunked over dim 0: without autograd in place, with autograd each
    chunk checkpointed.
    """

    def __init__(self, c: int, factor: int) -> None:
        super().__init__()
        self.norm = LayerNorm(c)
        self.proj_in = nn.Linear(c, 2 * factor * c, bias=False)
        self.proj_out = nn.Linear(factor * c, c, bias=False)

    def _update(self, x: torch.Tensor, residual: bool = False) -> torch.Tensor:
        return swiglu_transition(x, self.norm.weight, self.norm.bias, self.proj_in.weight, self.proj_out.weight,
                                 residual)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per_row_b = x[0].numel() * x.element_size() * (2 + 3 * self.proj_out.in_features // x.shape[-1])
        rc = chunking.rows_per_chunk(x.shape[0], per_row_b, chunking.budget_bytes(x))
        if torch.is_grad_enabled():  # x plus the update, a new tensor (ops.fused: the sum in the op's pass)
            if rc >= x.shape[0]:
                return self._update(x, residual=True)
            # Training: each row chunk is checkpointed, so its 4x-wide hidden activations are
            # recomputed in backward instead of being kept for the whole pair tensor. ``split``,
            # not slicing: its backward joins the chunks' gradients in one copy, where each
            # slice's would be a zero-filled tensor the size of x, summed.
            return torch.cat([checkpoint(self._update, rows, True, use_reentrant=False) for rows in x.split(rc)])
        for rs in chunking.slices(x.shape[0], rc):
            self._update(x[rs], residual=True)  # x[rs] += update
        return x
