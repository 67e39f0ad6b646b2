"""Building blocks of AF3's DiffusionTransformer (Algorithms 23-26), shared by the token
transformer of the diffusion module and the atom transformers (``atom_attention.py``).

* ``AdaLN`` (Alg. 26): LayerNorm of ``a`` modulated by the conditioning ``s``.
* ``ConditionedAttention`` (Alg. 24 without the attention itself): AdaLN, q/k/v/gate
  projections, and the ``s``-gated output projection. Who attends to whom (all tokens with
  gathered keys, or 32 x 128 atom windows with halo keys) is the caller's.
* ``ConditionedTransition`` (Alg. 25): AdaLN, SwiGLU, ``s``-gated output.
* ``NormedPairBias``: ``LinearNoBias(LayerNorm(z))`` to attention heads, applied to a pair
  tensor that was normalised ONCE (``normalize``): the LayerNorm's affine is folded into the
  projection, ``LN(z) W^T = z_hat (W diag(gamma))^T + W beta``. The diffusion module runs
  ``layers x steps`` bias projections of one fixed pair tensor; normalising it once halves
  that work and keeps one pair buffer (the normalised one) instead of two.

Shapes: ``a: [..., n, c_a]`` and ``s: [..., n, c_s]`` broadcast over leading (sample) dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.models.pairformer.ops.layer_norm import LayerNorm, layer_norm
from cpbench.models.pairformer.parallel import chunking


class AdaLN(nn.Module):
    """``sigmoid(W s_n + b) * LN(a) + W' s_n`` with ``s_n = LN(s)`` (scale only, AF3)."""

    def __init__(self, c_a: int, c_s: int) -> None:
        super().__init__()
        self.norm_a = LayerNorm(c_a, elementwise_affine=False)
        self.norm_s = LayerNorm(c_s, bias=False)
        self.scale = nn.Linear(c_s, c_a)
        self.shift = nn.Linear(c_s, c_a, bias=False)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = self.norm_s(s)
        return torch.sigmoid(self.scale(s)) * self.norm_a(a) + self.shift(s)


class ConditionedAttention(nn.Module):
    """Projections of AF3 Alg. 24 (attention with pair bias, conditioned on ``s``).

    ``project(a, s) -> (q, k, v, g)`` each ``[..., n, heads, head_dim]`` (``g`` already a
    sigmoid); ``finish(o, g, s)``: ``o: [..., n, heads, head_dim]`` -> the update ``[..., n, c_a]``.
    """

    def __init__(self, c_a: int, c_s: int, heads: int) -> None:
        super().__init__()
        if c_a % heads:
            raise ValueError(f"{c_a} channels are not divisible by {heads} heads")
        self.heads, self.head_dim = heads, c_a // heads
        self.adaln = AdaLN(c_a, c_s)
        self.q = nn.Linear(c_a, c_a)
        self.kvg = nn.Linear(c_a, 3 * c_a, bias=False)
        self.out = nn.Linear(c_a, c_a, bias=False)
        self.out_gate = nn.Linear(c_s, c_a)
        nn.init.constant_(self.out_gate.bias, -2.0)  # AF3: updates start small (adaLN-zero style)

    def project(self, a: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.adaln(a, s)
        split = (*x.shape[:-1], self.heads, self.head_dim)
        k, v, g = self.kvg(x).chunk(3, dim=-1)
        return self.q(x).view(split), k.reshape(split), v.reshape(split), torch.sigmoid(g).reshape(split)

    def finish(self, o: torch.Tensor, g: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        o = (o * g).flatten(-2)
        return torch.sigmoid(self.out_gate(s)) * self.out(o)


class ConditionedTransition(nn.Module):
    """AF3 Alg. 25: ``sigmoid(W_s s) * W_out(silu(W_a x) * W_b x)`` with ``x = AdaLN(a, s)``."""

    def __init__(self, c_a: int, c_s: int, factor: int = 2) -> None:
        super().__init__()
        self.adaln = AdaLN(c_a, c_s)
        self.proj_in = nn.Linear(c_a, 2 * factor * c_a, bias=False)
        self.proj_out = nn.Linear(factor * c_a, c_a, bias=False)
        self.out_gate = nn.Linear(c_s, c_a)
        nn.init.constant_(self.out_gate.bias, -2.0)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        x, y = self.proj_in(self.adaln(a, s)).chunk(2, dim=-1)
        return torch.sigmoid(self.out_gate(s)) * self.proj_out(F.silu(x) * y)


def normalize_(pair: torch.Tensor) -> torch.Tensor:
    """LayerNorm without affine over the last dim, in place, chunked over dim 0 (no autograd).

    Args: ``pair: [rows, ..., c]`` (e.g. ``z: [N/P, N, c_z]``). Returns ``pair``.
    """
    per_row_b = 3 * pair[0].numel() * pair.element_size()
    rc = chunking.rows_per_chunk(pair.shape[0], per_row_b, chunking.budget_bytes(pair))
    for rs in chunking.slices(pair.shape[0], rc):
        pair[rs] = layer_norm(pair[rs], pair.shape[-1:])
    return pair


class NormedPairBias(nn.Module):
    """Per-layer attention bias ``LinearNoBias(LayerNorm(p))`` from an already-normalised
    ``p_hat`` (``normalize_``): ``forward(p_hat: [..., c]) -> [..., heads]``."""

    def __init__(self, c_pair: int, heads: int) -> None:
        super().__init__()
        self.norm = LayerNorm(c_pair)
        self.proj = nn.Linear(c_pair, heads, bias=False)

    def forward(self, p_hat: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight * self.norm.weight  # [heads, c]
        return F.linear(p_hat, w, self.proj.weight @ self.norm.bias)
