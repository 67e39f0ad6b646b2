"""Single attention with pair bias on the 2d grid: the pair bias never moves.

Per rank ``(a, b)``: ``s: [R, c_s]`` (tokens ``R_a``, replicated over the grid row), ``z: [R, C,
c_z]``. Keys/values of the tile's column tokens are all-gathered along the grid column
(``O(N·c_s)``), and the partial softmaxes of the grid row are merged by a log-sum-exp
all-reduce (``O(N/cp0·c_s)``).
"""

from __future__ import annotations

import torch

from cpbench.models.pairformer.parallel import comm
from cpbench.models.pairformer.parallel.layout import Layout
from cpbench.models.pairformer.parallel.padding import key_bias


def attention_pair_bias_2d(mod, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor,
                           layout: Layout) -> torch.Tensor:
    """Single attention with pair bias on the grid (``mod``: ``single_att.AttentionPairBias``).

    Rank ``(a, b)`` attends its queries ``R_a`` over its keys ``C_b`` with its local bias tile,
    then the grid row merges the ``cp1`` partial softmaxes (log-sum-exp weights, one all-reduce).

    Args: ``s: [R, c_s]`` (tokens ``R_a``), ``z: [R, C, c_z]``, ``token_mask: [N]``.
    Returns: ``[R, c_s]``, identical on the ranks of the grid row.
    """
    grid = layout.grid
    n_rows, c_s = s.shape
    h, d = mod.heads, c_s // mod.heads
    cols = grid.cols(token_mask.shape[0])
    row = layout.row_axis()
    a = mod.norm_s(s)
    q = mod.q(a).view(n_rows, h, d).transpose(0, 1)  # [h, R, d]
    k, v, g = mod.kvg(a).chunk(3, dim=-1)
    kv = comm.all_gather_rows(torch.cat([k, v], dim=-1).contiguous(), layout.single_axis())[cols]
    k_c, v_c = (t.reshape(-1, h, d).transpose(0, 1) for t in kv.chunk(2, dim=-1))  # [h, C, d]
    bias = mod.pair_bias(z, key_bias(token_mask[cols], z.dtype))  # [h, R, C]
    logits = torch.baddbmm(bias.to(s.dtype), q, k_c.transpose(1, 2), alpha=d ** -0.5).float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [h, R, 1]
    o_p = torch.matmul(torch.exp(logits - lse), v_c.float())  # [h, R, d]
    del logits
    lse_max = comm.max_over_(lse.detach().clone(), row)  # any per-query constant: cancels below
    w = torch.exp(lse - lse_max)
    num_den = torch.cat([o_p * w, w], dim=-1)  # [h, R, d + 1]
    num_den = comm.sum_over(num_den, row)
    o = (num_den[..., :d] / num_den[..., d:]).to(s.dtype)
    o = o.transpose(0, 1).reshape(n_rows, c_s) * torch.sigmoid(g)
    return s + mod.out(o)
