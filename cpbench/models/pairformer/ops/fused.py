"""The memory-bound passes around the pair ops, as functions that ``kernels.compiled`` fuses.

Under the ``torch`` backend each runs eagerly, op by op, exactly as the layers did inline;
under ``flex`` on CUDA each is one ``torch.compile`` region, so LayerNorm, the gating
sigmoids, SwiGLU and the masks fuse into a few passes over the rows instead of one pass per
op (the matmuls stay cuBLAS). Weights come in as arguments so one compiled function serves
every layer of its kind. Shapes are per rank; ``rows`` is any leading shape (``[r, N]`` of a
pair shard, ``[r]`` of a single shard), ``c`` the channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cpbench.models.pairformer.ops import kernels


@kernels.compiled
def norm_linear(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor:
    """``LayerNorm(x) @ wᵀ``: ``x: [rows, c]``, ``w: [out, c]`` -> ``[rows, out]``."""
    return F.linear(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b), w)


@kernels.compiled
def swiglu_transition(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w_in: torch.Tensor,
                      w_out: torch.Tensor) -> torch.Tensor:
    """The transition's update ``W_out(silu(a) * b)``, ``[a; b] = W_in LN(x)``: ``x: [rows, c]``."""
    a, b = F.linear(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b), w_in).chunk(2, dim=-1)
    return F.linear(F.silu(a) * b, w_out)


@kernels.compiled
def gated_output(o: torch.Tensor, g: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """``W_out(o * sigmoid(g))``: ``o, g: [rows, h·d]`` -> ``[rows, c]``."""
    return F.linear(o * torch.sigmoid(g), w_out)


@kernels.compiled
def triangle_operands(z: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w: torch.Tensor,
                      mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triangle multiplication's gated, masked operands of rows ``z: [r, N, c_z]``.

    ``w: [4k, c_z]`` stacks the projections and gates of k channels of a and b; ``mask: [r, N]``.
    Returns ``(a, b)``, each ``[k, r, N]`` (channel-first: the layout the product batches over).
    """
    r, n = z.shape[:2]
    zn = F.layer_norm(z, (z.shape[-1],), ln_w, ln_b)
    pa, pb, ga, gb = torch.matmul(w, zn.reshape(r * n, -1).t()).view(4, -1, r, n).unbind(0)
    return pa * torch.sigmoid(ga) * mask, pb * torch.sigmoid(gb) * mask


@kernels.compiled
def triangle_update(x: torch.Tensor, z: torch.Tensor, ln_x_w: torch.Tensor, ln_x_b: torch.Tensor,
                    ln_z_w: torch.Tensor, ln_z_b: torch.Tensor, w_out: torch.Tensor,
                    w_gate: torch.Tensor) -> torch.Tensor:
    """Triangle multiplication's output stage ``W_out LN(x) * sigmoid(W_g LN(z))``:
    ``x: [r, N, c]``, ``z: [r, N, c_z]`` -> ``[r, N, c_z]``."""
    xn = F.layer_norm(x, (x.shape[-1],), ln_x_w, ln_x_b)
    zn = F.layer_norm(z, (z.shape[-1],), ln_z_w, ln_z_b)
    return F.linear(xn, w_out) * torch.sigmoid(F.linear(zn, w_gate))
