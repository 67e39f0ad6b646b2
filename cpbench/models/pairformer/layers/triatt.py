"""Triangle attention around the starting and ending node (AF3 Algorithms 14-15).

Starting node: for each row i, queries ``z_ij``, keys/values ``z_ik``, bias ``b_jk`` from
``z_jk``. Ending node is starting node on Z^T, so the op takes the row shard of the tensor it
attends along rows: Z (starting) or Z^T (ending); the block switches with
``transpose.transpose_pair``. Rows are independent: they are the batch of
``F.scaled_dot_product_attention`` with the shared ``[heads, N, N]`` bias (plus the key mask)
as ``attn_mask``. 1d: each rank projects the bias of its own rows and all-gathers it; only the
``N x N x heads`` bias travels, never z.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.ops.biased_attention import biased_attention
from cpbench.models.pairformer.ops.fused import gated_output, norm_linear
from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.ops.triangle_attention_2d import triangle_attention_2d
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.padding import key_bias


class TriangleAttention(nn.Module):
    """Gated triangle self-attention with pair bias, ``heads x head_dim``.

    ``forward(z, token_mask, layout)``: ``z: [N/P, N, c_z]`` (row shard of Z, or of Z^T when
    ``ending``), returns z plus the update in the same layout; in place without autograd,
    checkpointed row chunks with autograd when the activations would not fit the budget.
    Collectives (1d): all-gather of the bias, ``(P-1)·N/P·N·heads`` elements sent per rank.
    """

    def __init__(self, c_z: int, heads: int, head_dim: int, ending: bool = False) -> None:
        super().__init__()
        self.ending, self.heads, self.head_dim = ending, heads, head_dim
        self.norm = LayerNorm(c_z)
        self.qkvg = nn.Linear(c_z, 4 * heads * head_dim, bias=False)
        self.bias_proj = nn.Linear(c_z, heads, bias=False)
        self.out = nn.Linear(heads * head_dim, c_z, bias=False)

    def _bias(self, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The global bias ``[heads, N, N]`` (query pos, key pos) + key mask, from ``z`` rows."""
        n_local, n_pad, c_z = z.shape
        if torch.is_grad_enabled():
            local = self._norm_linear(z, self.bias_proj)
        else:
            local = z.new_empty((n_local, n_pad, self.heads))
            rc = chunking.rows_per_chunk(n_local, n_pad * 2 * c_z * z.element_size(), chunking.budget_bytes(z))
            for rs in chunking.slices(n_local, rc):
                local[rs] = self._norm_linear(z[rs], self.bias_proj)
        full = comm.all_gather_rows(local.contiguous(), layout)  # [N, N, heads]
        # contiguous: the permuted sum keeps a head stride of 1, and CUDA's memory-efficient SDPA
        # needs a unit last-dim stride; otherwise it falls back to the math kernel, which
        # materialises [rows, heads, N, N] logits (128 GiB at N=2048).
        if torch.is_grad_enabled():
            return (full.permute(2, 0, 1) + key_bias(token_mask, z.dtype)).contiguous()
        return full.permute(2, 0, 1).contiguous().add_(key_bias(token_mask, z.dtype))  # one copy

    def _norm_linear(self, z: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
        return norm_linear(z, self.norm.weight, self.norm.bias, proj.weight)

    def _attend(self, z_rows: torch.Tensor, bias: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """Rows ``z_rows: [r, N, c_z]``, ``bias: [heads, N, N]`` -> update ``[r, N, c_z]``; with
        ``residual``, ``z_rows`` plus the update (in place without autograd: ``z_rows``)."""
        r, n_pad, _ = z_rows.shape
        h, d = self.heads, self.head_dim
        q, k, v, g = self._norm_linear(z_rows, self.qkvg).view(r, n_pad, 4, h, d).unbind(2)
        o = biased_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias)
        return gated_output(o.transpose(1, 2).reshape(r, n_pad, h * d), g.reshape(r, n_pad, h * d), self.out.weight,
                            z_rows if residual else None)

    def forward(self, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Args: ``z: [N/P, N, c_z]``, ``token_mask: [N]`` bool. Returns ``[N/P, N, c_z]``."""
        if layout.kind == TWO_D and layout.sharded:  # tiles [N/cp0, N/cp1, c_z]: ring (ops/triangle_attention_2d.py)
            return triangle_attention_2d(self, z, token_mask, layout)
        bias = self._bias(z, token_mask, layout)
        n_local, n_pad, c_z = z.shape
        h, d = self.heads, self.head_dim
        if torch.is_grad_enabled():
            # Per row of z: LN, q/k/v/g, output; and [heads, N, N] for the bias gradient of the
            # broadcast bias (SDPA on CUDA) or the logits and probabilities of the unfused kernel
            # (CPU). Compiled flex accumulates the bias gradient of all rows into one [heads, N, N]
            # buffer per chunk (no per-row term; with it flex ran ~20x more, smaller chunks than
            # it needs: 147 of 14 rows per op, against 7, in a lean training probe point at N=2,048).
            per_row = n_pad * (2 * c_z + 7 * h * d) + (0 if kernels.compiling(z) else 3 * h * n_pad * n_pad)
            per_row_b = per_row * z.element_size()
            rc = chunking.rows_per_chunk(n_local, per_row_b, chunking.budget_bytes(z))
            if rc >= n_local:  # z plus the update, a new tensor (ops.fused: the sum in the output's pass)
                return self._attend(z, bias, residual=True)
            # Checkpointed row chunks: backward keeps z and the bias, recomputes one chunk at a time.
            return torch.cat([checkpoint(self._attend, z_rows, bias, True, use_reentrant=False)
                              for z_rows in z.split(rc)])
        # Per row: normed z, q/k/v/g, output; the unfused CPU kernel also holds the logits.
        per_row = n_pad * (2 * c_z + 6 * h * d) + (0 if z.is_cuda else 2 * h * n_pad)
        rc = chunking.rows_per_chunk(n_local, per_row * z.element_size(), chunking.budget_bytes(z))
        for rs in chunking.slices(n_local, rc):
            self._attend(z[rs], bias, residual=True)  # z[rs] += update
        return z
