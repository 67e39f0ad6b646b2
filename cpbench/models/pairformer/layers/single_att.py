"""Single attention with pair bias (AF3 Algorithm 24, without the conditioning of the diffusion
module): the single representation attends over tokens with a bias projected from z.

1d: queries and the pair bias are local (rows of z are this rank's tokens); keys and values are
all-gathered, ``2·(P-1)·N/P·c_s`` elements sent per rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.models.pairformer.ops.fused import norm_linear
from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.ops.pair_bias_attention_2d import attention_pair_bias_2d
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.padding import key_bias


class AttentionPairBias(nn.Module):
    """Gated multi-head attention over tokens with pair bias.

    ``forward(s, z, token_mask, layout)``: ``s: [N/P, c_s]``, ``z: [N/P, N, c_z]`` (row shard
    of Z), ``token_mask: [N]``; returns ``s`` plus the update ``[N/P, c_s]``.
    """

    def __init__(self, c_s: int, c_z: int, heads: int) -> None:
        super().__init__()
        if c_s % heads:
            raise ValueError(f"c_s={c_s} is not divisible by heads_single={heads}")
        self.heads = heads
        self.norm_s = LayerNorm(c_s)
        self.q = nn.Linear(c_s, c_s)
        self.kvg = nn.Linear(c_s, 3 * c_s, bias=False)
        # No LayerNorm offset: it would add a per-head constant to every logit of a row, which the
        # softmax cancels, so its gradient is exactly zero and AdamW would random-walk it on
        # rounding noise (Boltz-2 keeps that dead parameter).
        self.norm_z = LayerNorm(c_z, bias=False)
        self.bias_proj = nn.Linear(c_z, heads, bias=False)
        self.out = nn.Linear(c_s, c_s, bias=False)

    def pair_bias(self, z: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The attention bias per head: ``z: [R, C, c_z]`` (rows of Z: this rank's queries, its
        key columns) and ``keys: [C]`` (``key_bias``) -> ``[heads, R, C]``, contiguous.

        Without autograd, chunked over rows: each chunk's ``[r, C, heads]`` projection is added to
        the key bias straight into its rows of the ``[heads, R, C]`` result (one pass, where a
        permuted sum would be written and then copied again to be contiguous)."""
        if torch.is_grad_enabled():  # one fused pass (the Triton kernel with model.passes=triton)
            return (norm_linear(z, self.norm_z.weight, None, self.bias_proj.weight).permute(2, 0, 1) + keys).contiguous()
        n_rows, n_cols, c_z = z.shape
        bias = z.new_empty((self.heads, n_rows, n_cols))
        rc = chunking.rows_per_chunk(n_rows, n_cols * 2 * c_z * z.element_size(), chunking.budget_bytes(z))
        fused = not chunking.near_limit(z)  # compiled under flex
        for rs in chunking.slices(n_rows, rc):
            if fused:
                part = norm_linear(z[rs], self.norm_z.weight, None, self.bias_proj.weight)
            else:
                part = self.bias_proj(self.norm_z(z[rs]))
            torch.add(part.permute(2, 0, 1), keys, out=bias[:, rs])
        return bias

    def forward(self, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        if layout.kind == TWO_D and layout.sharded:  # s [N/cp0, c_s], z tile [N/cp0, N/cp1, c_z] (cp2d.py)
            return attention_pair_bias_2d(self, s, z, token_mask, layout)
        n_local, c_s = s.shape
        h, d = self.heads, c_s // self.heads
        a = self.norm_s(s)
        q = self.q(a)
        k, v, g = self.kvg(a).chunk(3, dim=-1)
        k = comm.all_gather_rows(k.contiguous(), layout)  # [N, c_s]
        v = comm.all_gather_rows(v.contiguous(), layout)
        n_pad = k.shape[0]
        # contiguous: unit last-dim stride for CUDA's memory-efficient SDPA (see triatt._bias)
        bias = self.pair_bias(z, key_bias(token_mask, z.dtype))  # [h, N/P, N]
        o = F.scaled_dot_product_attention(
            q.view(n_local, h, d).transpose(0, 1).unsqueeze(0),
            k.view(n_pad, h, d).transpose(0, 1).unsqueeze(0),
            v.view(n_pad, h, d).transpose(0, 1).unsqueeze(0),
            attn_mask=bias.unsqueeze(0).to(s.dtype))
        o = o[0].transpose(0, 1).reshape(n_local, c_s) * torch.sigmoid(g)
        return s + self.out(o)
