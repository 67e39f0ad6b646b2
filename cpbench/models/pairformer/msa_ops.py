"""The two MSA <-> pair ops of the MSA module: outer product mean (AF3 Alg. 9) and pair-weighted
averaging (AF3 Alg. 10), over the 1d layout ``m: [S, N/P, c_m]``, ``z: [N/P, N, c_z]``.

Both need a per-column quantity of *every* column j while a rank holds the columns of its own
rows i: it is all-gathered along the token axis (``comm``; counted in ``comm.BYTES``). With
autograd in one piece (``all_gather_rows``, backward a reduce-scatter); without autograd in
chunks, ``(S-chunk, column-chunk)`` at a time: every rank sends columns ``js`` of its shard and
receives columns ``r*N/P + js`` of every rank r, so no ``[S, N, ·]`` buffer lives on a rank and
the total volume is the same as one gather, ``(P-1)·|x_local|``. Those loops issue collectives,
so their chunk sizes derive from one budget the ranks agree on (``comm.agree_min``, one small
all-reduce per call): free memory differs slightly between GPUs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.models.pairformer import chunking, comm
from cpbench.models.pairformer.layout import Layout
from cpbench.models.pairformer.padding import key_bias

OPM_EPS = 1e-3  # OpenFold / Boltz: z += W o / (eps + sum_s mask_si mask_sj)


def gather_columns(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Every column of a column-sharded tensor (autograd-aware).

    Args: ``x: [S, N/P, c]``. Returns: ``[S, N, c]`` (a view when serial). Sends ``(P-1)·|x|``."""
    if not layout.sharded:
        return x
    return comm.all_gather_rows(x.transpose(0, 1).contiguous(), layout).transpose(0, 1)


def gather_column_chunk(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Raw (no autograd) gather of one chunk: ``x: [s, cj, c]`` (columns ``js`` of this rank)
    -> ``[P, s, cj, c]`` (columns ``r*N/P + js`` of rank r). Serial: a view ``[1, s, cj, c]``."""
    if not layout.sharded:
        return x[None]
    x = x.contiguous()
    return comm.gather_into(x.new_empty((layout.size, *x.shape)), x, layout)


def _ranks(layout: Layout) -> int:
    return layout.size if layout.sharded else 1


class OuterProductMean(nn.Module):
    """``z_ij += (W flatten(Σ_s a_si ⊗ b_sj) + bias) / (eps + Σ_s mask_si mask_sj)``.

    ``forward(m, z, msa_mask, layout)``: ``m: [S, N/P, c_m]``, ``z: [N/P, N, c_z]``,
    ``msa_mask: [S, N/P]`` bool. Returns z (in place without autograd). Gathers ``b`` and the
    mask: ``(P-1)·S·N/P·(c_opm+1)`` elements sent per rank.
    """

    def __init__(self, c_m: int, c_z: int, c_opm: int = 32) -> None:
        super().__init__()
        self.c_opm = c_opm
        self.norm = nn.LayerNorm(c_m)
        self.proj_a = nn.Linear(c_m, c_opm, bias=False)
        self.proj_b = nn.Linear(c_m, c_opm, bias=False)
        self.out = nn.Linear(c_opm * c_opm, c_z)

    def _a(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.proj_a(self.norm(m)) * mask.to(m.dtype)[..., None]

    def _b_and_mask(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[s, n, c_opm + 1]``: the masked ``b`` with the mask as its last channel."""
        mk = mask.to(m.dtype)[..., None]
        return torch.cat([self.proj_b(self.norm(m)) * mk, mk], dim=-1)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self._forward_lean(m, z, msa_mask, layout)
        c = self.c_opm
        a = self._a(m, msa_mask)
        bg = gather_columns(self._b_and_mask(m, msa_mask), layout)  # [S, N, c+1]
        outer = torch.einsum("sic,sjd->ijcd", a, bg[..., :c]).flatten(-2)  # [N/P, N, c*c]
        norm = torch.einsum("si,sj->ij", msa_mask.to(a.dtype), bg[..., c])
        return z + self.out(outer) / (norm[..., None] + OPM_EPS)

    def _forward_lean(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """``a`` of the local columns once (``[N/P, c, S]``, half an m shard); then column chunk
        by column chunk: gather ``b`` of ``w`` columns per rank over all S, and for row chunks
        contract over S into ``[rows, c, P, w, c]`` (never ``[N/P, N, c²]``), project, add to z."""
        n, _, c_z = z.shape
        p, c, s_total, es = _ranks(layout), self.c_opm, m.shape[0], z.element_size()
        budget_b = comm.agree_min(chunking.budget_bytes(z), layout, z.device)
        sc = chunking.rows_per_chunk(s_total, n * (3 * m.shape[-1] + 2 * c) * es, budget_b)
        a = z.new_empty((n, c, s_total))
        for ss in chunking.slices(s_total, sc):
            a[:, :, ss] = self._a(m[ss], msa_mask[ss]).permute(1, 2, 0)
        mask_t = msa_mask.t().to(z.dtype)  # [N/P, S]
        z_cols = z.view(n, p, n, c_z)  # column block r of rank r's rows
        # per column: LayerNorm + projection of m, the sent b and the gathered P copies of it
        w = chunking.rows_per_chunk(n, s_total * (3 * m.shape[-1] + 3 * p * (c + 1)) * es, budget_b // 2)
        for js in chunking.slices(n, w):
            wl = js.stop - js.start
            b = self._b_and_mask(m[:, js], msa_mask[:, js])  # [S, w, c+1]
            got = gather_column_chunk(b, layout)  # [P, S, w, c+1]
            del b
            b_t = got[..., :c].permute(1, 0, 2, 3).reshape(s_total, p * wl * c)
            norm = (mask_t @ got[..., c].permute(1, 0, 2).reshape(s_total, p * wl)).view(n, p, wl, 1)
            del got
            rc = chunking.rows_per_chunk(n, p * wl * (2 * c * c + 2 * c_z) * es, budget_b // 2)
            for rs in chunking.slices(n, rc):
                r = rs.stop - rs.start
                outer = (a[rs].reshape(r * c, s_total) @ b_t).view(r, c, p, wl, c)
                outer = outer.permute(0, 2, 3, 1, 4).reshape(r, p, wl, c * c)
                z_cols[rs, :, js] += self.out(outer) / (norm[rs] + OPM_EPS)
                del outer
        return z


class PairWeightedAveraging(nn.Module):
    """``m_si += W (g_si ⊙ Σ_j softmax_j(W_b LN(z_ij)) v_sj)`` per head (AF3 Alg. 10).

    ``forward(m, z, token_mask, layout)``: ``m: [S, N/P, c_m]``, ``z: [N/P, N, c_z]`` (the
    weights of the local rows i come from the local z rows), ``token_mask: [N]``. Returns m (in
    place without autograd). Gathers ``v``: ``(P-1)·S·N/P·heads·head_dim`` elements per rank.
    """

    def __init__(self, c_m: int, c_z: int, heads: int = 8, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm_m = nn.LayerNorm(c_m)
        self.proj_v = nn.Linear(c_m, heads * head_dim, bias=False)
        self.proj_g = nn.Linear(c_m, heads * head_dim, bias=False)
        # No LayerNorm bias: W_b·beta would shift every logit of a row alike (a softmax no-op).
        self.norm_z = nn.LayerNorm(c_z, bias=False)
        self.proj_w = nn.Linear(c_z, heads, bias=False)
        self.out = nn.Linear(heads * head_dim, c_m, bias=False)

    def _weights(self, z: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """Rows ``z: [r, N, c_z]`` -> ``[r, N, heads]``, softmax over the keys j (masked)."""
        logits = self.proj_w(self.norm_z(z)) + key_bias(token_mask, z.dtype)[None, :, None]
        return torch.softmax(logits, dim=1)

    def forward(self, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self._forward_lean(m, z, token_mask, layout)
        s_total, n, _ = m.shape
        h, d = self.heads, self.head_dim
        mn = self.norm_m(m)
        vg = gather_columns(self.proj_v(mn), layout)  # [S, N, h*d]
        w = self._weights(z, token_mask)
        o = torch.einsum("ijh,sjhd->sihd", w, vg.reshape(s_total, -1, h, d)).reshape(s_total, n, h * d)
        return m + self.out(torch.sigmoid(self.proj_g(mn)) * o)

    def _forward_lean(self, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Weights ``[N/P, N, h]`` once (row chunks); then S chunks, each gathering v in column chunks."""
        s_total, n, c_m = m.shape
        p, h, d, es = _ranks(layout), self.heads, self.head_dim, z.element_size()
        budget_b = comm.agree_min(chunking.budget_bytes(z), layout, z.device)
        w = z.new_empty((n, z.shape[1], h))
        rc = chunking.rows_per_chunk(n, z.shape[1] * (2 * z.shape[2] + 2 * h) * es, budget_b)
        for rs in chunking.slices(n, rc):
            w[rs] = self._weights(z[rs], token_mask)
        w_cols = w.view(n, p, n, h)
        sc = chunking.rows_per_chunk(s_total, n * (2 * c_m + 4 * h * d) * es, budget_b // 2)
        for ss in chunking.slices(s_total, sc):
            mn = self.norm_m(m[ss])
            v = self.proj_v(mn)  # [s, n, h*d]
            o = torch.zeros_like(v).view(-1, n, h, d)
            cj = chunking.rows_per_chunk(n, 2 * p * (ss.stop - ss.start) * h * d * es, budget_b // 2)
            for js in chunking.slices(n, cj):
                got = gather_column_chunk(v[:, js], layout)  # [P, s, cj, h*d]
                o += torch.einsum("ipjh,psjhd->sihd", w_cols[:, :, js], got.view(*got.shape[:3], h, d))
                del got
            m[ss] += self.out(torch.sigmoid(self.proj_g(mn)) * o.view(v.shape))
        return m
