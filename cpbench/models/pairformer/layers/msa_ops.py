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

2d (``cp0 x cp1`` grid, ``grid.py``; ``R = N/cp0``, ``C = N/cp1``): rank ``(a, b)`` holds the
MSA columns of its tile rows, ``m: [S, R, c_m]`` (tokens ``R_a``), replicated over the ``cp1``
ranks of its grid row like the single representation (``layout.py``), and ``z: [R, C, c_z]``.
Each rank's replica of m carries the part of the gradient that flows through its own uses (the
convention of ``ops/pair_bias_attention_2d.py``), so summing parameter gradients over the grid is
exact. A per-column quantity of the tile columns ``C_b`` is all-gathered along the grid column
(the ``cp0`` ranks ``(*, b)`` hold every token between them) and sliced to ``C_b``:
``(cp0-1)·|x_local|`` sent per rank (``column_tokens``; without autograd in chunks).
"""

from __future__ import annotations

import torch
from torch import nn

from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.padding import key_bias

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


def _is_2d(layout: Layout) -> bool:
    return layout.kind == TWO_D and layout.sharded


def column_tokens(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """2d: the tile columns' tokens of a grid-row-replicated per-token tensor (autograd-aware).

    Args: ``x: [S, R, c]`` tokens ``R_a``. Returns ``[S, C, c]`` tokens ``C_b``: all-gathered
    along the grid column (``(cp0-1)·|x|`` sent; backward a reduce-scatter), then sliced."""
    grid = layout.grid
    cols = grid.cols(x.shape[1] * grid.cp0)
    return gather_columns(x, layout.single_axis())[:, cols]


def _column_pieces(got: torch.Tensor, js: slice, n_rows: int, layout: Layout):
    """2d: of ``got: [cp0, S, w, c]`` (tokens ``a2·R + js`` from every grid-column rank ``a2``),
    the pieces inside the tile columns ``C_b``: yields ``(piece [S, w', c], z tile columns)``."""
    grid = layout.grid
    cols = grid.cols(n_rows * grid.cp0)
    for a2 in range(grid.cp0):
        lo, hi = max(a2 * n_rows + js.start, cols.start), min(a2 * n_rows + js.stop, cols.stop)
        if lo < hi:
            src = slice(lo - a2 * n_rows - js.start, hi - a2 * n_rows - js.start)
            yield got[a2, :, src], slice(lo - cols.start, hi - cols.start)


class OuterProductMean(nn.Module):
    """``z_ij += (W flatten(Σ_s a_si ⊗ b_sj) + bias) / (eps + Σ_s mask_si mask_sj)``.

    ``forward(m, z, msa_mask, layout)``: ``m: [S, N/P, c_m]``, ``z: [N/P, N, c_z]``,
    ``msa_mask: [S, N/P]`` bool. Returns z (in place without autograd). Gathers ``b`` and the
    mask: ``(P-1)·S·N/P·(c_opm+1)`` elements sent per rank.

    2d: ``m: [S, R, c_m]``, ``msa_mask: [S, R]`` (tokens ``R_a``), ``z: [R, C, c_z]``; ``a`` is
    local, ``b`` and the mask of the tile columns come from the grid column
    (``column_tokens``): ``(cp0-1)·S·R·(c_opm+1)`` elements sent per rank.
    """

    def __init__(self, c_m: int, c_z: int, c_opm: int = 32) -> None:
        super().__init__()
        self.c_opm = c_opm
        self.norm = LayerNorm(c_m)
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
            if _is_2d(layout):
                return self._forward_lean_2d(m, z, msa_mask, layout)
            return self._forward_lean(m, z, msa_mask, layout)
        c = self.c_opm
        a = self._a(m, msa_mask)
        b_mask = self._b_and_mask(m, msa_mask)
        # [S, N, c+1] (2d: [S, C, c+1], the tile columns)
        bg = column_tokens(b_mask, layout) if _is_2d(layout) else gather_columns(b_mask, layout)
        outer = torch.einsum("sic,sjd->ijcd", a, bg[..., :c]).flatten(-2)  # [N/P, N, c*c]
        norm = torch.einsum("si,sj->ij", msa_mask.to(a.dtype), bg[..., c])
        return z + self.out(outer) / (norm[..., None] + OPM_EPS)

    def _forward_lean(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """``a`` of the local columns once (``[N/P, c, S]``, half an m shard); then column chunk
        by column chunk: gather ``b`` of ``w`` columns per rank over all S, and for row chunks
        contract over S into ``[rows, c, P, w, c]`` (never ``[N/P, N, c²]``), project, add to z."""
        n, _, c_z = z.shape
        p, c, s_total, es = _ranks(layout), self.c_opm, m.shape[0], z.element_size()
        budget_b = comm.agree_min(chunking.budget_bytes(z), layout, z)
        a = self._a_lean(m, msa_mask, z, budget_b)
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

    def _a_lean(self, m: torch.Tensor, msa_mask: torch.Tensor, z: torch.Tensor, budget_b: int) -> torch.Tensor:
        """``a`` of the local tokens, ``[n, c_opm, S]``, computed in S chunks (no autograd)."""
        s_total, n, c_m = m.shape
        sc = chunking.rows_per_chunk(s_total, n * (3 * c_m + 2 * self.c_opm) * z.element_size(), budget_b)
        a = z.new_empty((n, self.c_opm, s_total))
        for ss in chunking.slices(s_total, sc):
            a[:, :, ss] = self._a(m[ss], msa_mask[ss]).permute(1, 2, 0)
        return a

    def _forward_lean_2d(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """2d no-grad path: ``a`` of the tile rows once (``[R, c, S]``); then, chunk by chunk of
        ``w`` local tokens, gather ``b`` and the mask along the grid column over all S
        (``[cp0, S, w, c+1]``, never ``[S, N, ·]``) and add the pieces that fall in the tile
        columns ``C_b`` to z, in row chunks (never ``[R, C, c²]``)."""
        n_rows, _, c_z = z.shape
        c, s_total, es = self.c_opm, m.shape[0], z.element_size()
        col = layout.single_axis()
        budget_b = comm.agree_min(chunking.budget_bytes(z), layout, z)
        a = self._a_lean(m, msa_mask, z, budget_b)
        mask_t = msa_mask.t().to(z.dtype)  # [R, S]
        # per local token: LayerNorm + projection of m, the sent b, the gathered copies and a piece
        per_token_b = s_total * (3 * m.shape[-1] + (col.size + 2) * (c + 1)) * es
        # the gathers run in lock-step over the grid: the chunk count derives from the agreed budget
        w = chunking.rows_per_chunk(n_rows, per_token_b, budget_b // 2)
        for js in chunking.slices(n_rows, w):
            got = gather_column_chunk(self._b_and_mask(m[:, js], msa_mask[:, js]), col)  # [cp0, S, w, c+1]
            for piece, zc in _column_pieces(got, js, n_rows, layout):
                wl = zc.stop - zc.start
                b_t = piece[..., :c].reshape(s_total, wl * c)
                norm = (mask_t @ piece[..., c]).view(n_rows, wl, 1)
                rc = chunking.rows_per_chunk(n_rows, wl * (2 * c * c + 2 * c_z) * es, budget_b // 2)
                for rs in chunking.slices(n_rows, rc):
                    r = rs.stop - rs.start
                    outer = (a[rs].reshape(r * c, s_total) @ b_t).view(r, c, wl, c)
                    outer = outer.permute(0, 2, 1, 3).reshape(r, wl, c * c)
                    z[rs, zc] += self.out(outer) / (norm[rs] + OPM_EPS)
                    del outer
            del got
        return z


class PairWeightedAveraging(nn.Module):
    """``m_si += W (g_si ⊙ Σ_j softmax_j(W_b LN(z_ij)) v_sj)`` per head (AF3 Alg. 10).

    ``forward(m, z, token_mask, layout)``: ``m: [S, N/P, c_m]``, ``z: [N/P, N, c_z]`` (the
    weights of the local rows i come from the local z rows), ``token_mask: [N]``. Returns m (in
    place without autograd). Gathers ``v``: ``(P-1)·S·N/P·heads·head_dim`` elements per rank.

    2d: ``m: [S, R, c_m]`` (tokens ``R_a``), ``z: [R, C, c_z]``. The weights of the tile are
    normalised over every j by a log-sum-exp merge across the grid row (two all-reduces of
    ``[R, heads]``: a max and a sum; the softmax does not depend on s); ``v`` of the tile
    columns comes from the grid column (``column_tokens``: ``(cp0-1)·S·R·heads·head_dim``
    elements); the partial sums over the tile columns are all-reduced along the grid row
    (``2(cp1-1)/cp1·S·R·heads·head_dim`` elements). Per rank ``S·R·C·heads·head_dim`` MACs.
    """

    def __init__(self, c_m: int, c_z: int, heads: int = 8, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm_m = LayerNorm(c_m)
        self.proj_v = nn.Linear(c_m, heads * head_dim, bias=False)
        self.proj_g = nn.Linear(c_m, heads * head_dim, bias=False)
        # No LayerNorm bias: W_b·beta would shift every logit of a row alike (a softmax no-op).
        self.norm_z = LayerNorm(c_z, bias=False)
        self.proj_w = nn.Linear(c_z, heads, bias=False)
        self.out = nn.Linear(heads * head_dim, c_m, bias=False)

    def _weights(self, z: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """Rows ``z: [r, N, c_z]`` -> ``[r, N, heads]``, softmax over the keys j (masked)."""
        logits = self.proj_w(self.norm_z(z)) + key_bias(token_mask, z.dtype)[None, :, None]
        return torch.softmax(logits, dim=1)

    def _logits_2d(self, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Tile rows ``z: [r, C, c_z]`` -> unnormalised logits ``[r, C, heads]`` (keys masked)."""
        cols = layout.cols(token_mask.shape[0])
        return self.proj_w(self.norm_z(z)) + key_bias(token_mask[cols], z.dtype)[None, :, None]

    @staticmethod
    def _row_lse_2d(lse_local: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Merge per-tile log-sum-exps ``[R, heads]`` over the grid row into the global ones."""
        row = layout.row_axis()
        top = comm.max_over_(lse_local.detach().clone(), row)  # any per-row constant: cancels
        sum_exp = torch.exp(lse_local - top)
        sum_exp = comm.sum_over(sum_exp, row)
        return top + torch.log(sum_exp)

    def forward(self, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        if not torch.is_grad_enabled():
            if _is_2d(layout):
                return self._forward_lean_2d(m, z, token_mask, layout)
            return self._forward_lean(m, z, token_mask, layout)
        if _is_2d(layout):
            return self._forward_2d(m, z, token_mask, layout)
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
        budget_b = comm.agree_min(chunking.budget_bytes(z), layout, z)
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

    def _forward_2d(self, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """2d autograd path (class docstring); ``m: [S, R, c_m]``, ``z: [R, C, c_z]``."""
        s_total, n_rows, _ = m.shape
        h, d = self.heads, self.head_dim
        row = layout.row_axis()
        mn = self.norm_m(m)
        v = column_tokens(self.proj_v(mn), layout)  # [S, C, h*d]
        logits = self._logits_2d(z, token_mask, layout)  # [R, C, h]
        lse = self._row_lse_2d(torch.logsumexp(logits, dim=1), layout)  # [R, h]
        w = torch.exp(logits - lse[:, None])
        o = torch.einsum("ijh,sjhd->sihd", w, v.reshape(s_total, -1, h, d)).reshape(s_total, n_rows, h * d)
        o = comm.sum_over(o, row)
        return m + self.out(torch.sigmoid(self.proj_g(mn)) * o)

    def _forward_lean_2d(self, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """2d no-grad path: the tile's weights ``[R, C, h]`` once (row chunks, then one merge);
        then S chunks, each gathering v along the grid column (``[cp0, s, R, h*d]``) and
        all-reducing its partial output along the grid row."""
        s_total, n_rows, c_m = m.shape
        n_cols = z.shape[1]
        h, d, es = self.heads, self.head_dim, z.element_size()
        col, row = layout.single_axis(), layout.row_axis()
        budget_b = comm.agree_min(chunking.budget_bytes(z), layout, z)
        w = z.new_empty((n_rows, n_cols, h))
        lse = z.new_empty((n_rows, h))
        rc = chunking.rows_per_chunk(n_rows, n_cols * (2 * z.shape[2] + 2 * h) * es, budget_b)
        for rs in chunking.slices(n_rows, rc):
            w[rs] = self._logits_2d(z[rs], token_mask, layout)
            lse[rs] = torch.logsumexp(w[rs], dim=1)
        lse = self._row_lse_2d(lse, layout)
        for rs in chunking.slices(n_rows, rc):
            w[rs] = torch.exp(w[rs] - lse[rs, None])
        # per MSA row: m's LayerNorm and v/g projections, the gathered copies of v, the tile
        # columns' v and the partial output
        per_s_b = (2 * n_rows * c_m + (col.size + 4) * n_rows * h * d + n_cols * h * d) * es
        sc = chunking.rows_per_chunk(s_total, per_s_b, budget_b // 2)  # from the agreed budget: same on every rank
        for ss in chunking.slices(s_total, sc):
            s_len = ss.stop - ss.start
            mn = self.norm_m(m[ss])
            got = gather_column_chunk(self.proj_v(mn), col)  # [cp0, s, R, h*d]
            o = z.new_zeros((s_len, n_rows, h, d))
            for piece, zc in _column_pieces(got, slice(0, n_rows), n_rows, layout):
                o += torch.einsum("ijh,sjhd->sihd", w[:, zc], piece.reshape(s_len, -1, h, d))
            del got
            comm.all_reduce_(o, row)
            m[ss] += self.out(torch.sigmoid(self.proj_g(mn)) * o.view(s_len, n_rows, h * d))
        return m
