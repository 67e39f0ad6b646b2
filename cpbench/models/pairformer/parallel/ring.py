"""The generalised Cannon schedule (``RingWalk``): how the tiles of a 2d product travel.

Generalised Cannon (square and non-square grids). A product ``x[R_a, C_b] = sum_k A[R_a, k]
B[k, C_b]`` with ``A`` tiled like ``X`` (its k-blocks are the cp1 column blocks, travelling
along grid row ``a``) and ``B`` tiled like ``X`` (its k-blocks are the cp0 row blocks,
travelling along grid column ``b``). Cut k into ``L = lcm(cp0, cp1)`` panels; rank ``(a, b)``
walks the k-circle from panel ``k0 = a·L/cp0 + b·L/cp1`` for ``L`` panels. Its walk crosses an
A-block boundary at clock offsets that depend on ``a`` only, and a B-block boundary at offsets
that depend on ``b`` only, so every rank of a row shifts its A tile at the same clock (and every
rank of a column its B tile): the shifts are the ring shifts of Cannon's algorithm and the
starting tiles its skew. Square grids: ``k0 = a + b``, ``cp`` pieces, exactly Cannon. A walk
has at most ``cp0 + cp1`` pieces; per rank it moves ``≈ |A-row| + |B-column|`` bytes
(``N²·c·(1/cp0 + 1/cp1)``, i.e. ``2·N²·c/√P`` on a square grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from cpbench.models.pairformer.parallel.grid import Grid
from cpbench.models.pairformer.parallel.p2p import TAG_ACC, TAG_RO, exchange, permute, wait_all


@dataclass(frozen=True)
class Piece:
    """One k-range of a walk: tokens ``ka`` of the current A tile (A-block ``a_block``) and the
    same tokens as ``kb`` of the current B tile; ``a_shift`` / ``b_shift``: the tile moved on
    along its ring right before this piece. ``k``: the global token range."""

    ka: slice
    kb: slice
    k: slice
    a_block: int
    a_shift: bool
    b_shift: bool


class RingWalk:
    """The generalised Cannon schedule of rank ``(a, b)`` for ``n_pad`` tokens (module docstring).

    ``run(a_ro, b_ro, fn)`` moves the A tile (A-blocks of cp1 columns, along grid row ``a``) and
    the B tile (B-blocks of cp0 rows, along grid column ``b``): skew, then at each piece
    ``fn(a_tile, b_tile, piece)``. Read-only tiles are double-buffered: the next one is in flight
    (async isend/irecv) while ``fn`` works on the current one. Accumulators (``a_acc``,
    ``b_acc``) travel with their tiles and go back to the tile's home rank at the end (the
    backward of a Cannon product accumulates the gradient of each tile this way).
    """

    def __init__(self, grid: Grid, n_pad: int) -> None:
        self.grid = grid
        p, q, a, b = grid.cp0, grid.cp1, grid.a, grid.b
        n_l = grid.units
        wa, wb, m = n_l // q, n_l // p, n_pad // n_l  # A / B block widths in panels; tokens per panel
        k0 = a * wb + b * wa
        cuts = [k for k in range(k0 + 1, k0 + n_l) if k % wa == 0 or k % wb == 0]
        points = [k0, *cuts, k0 + n_l]
        self.pieces: list[Piece] = []
        for s, e in zip(points[:-1], points[1:]):
            base_a, base_b = (s // wa) * wa, (s // wb) * wb
            g0 = (s % n_l) * m
            self.pieces.append(Piece(
                ka=slice((s - base_a) * m, (e - base_a) * m), kb=slice((s - base_b) * m, (e - base_b) * m),
                k=slice(g0, g0 + (e - s) * m), a_block=(s // wa) % q,
                a_shift=s != k0 and s % wa == 0, b_shift=s != k0 and s % wb == 0))
        # Offsets (in blocks) from this rank's own block to the block it holds: at the start, at the end.
        self.a_skew, self.b_skew = (k0 // wa - b) % q, (k0 // wb - a) % p
        n_a = sum(pc.a_shift for pc in self.pieces)
        n_b = sum(pc.b_shift for pc in self.pieces)
        self.a_end, self.b_end = (self.a_skew + n_a) % q, (self.b_skew + n_b) % p

    def _row(self, db: int) -> int:
        return self.grid.rank_of(self.grid.a, self.grid.b + db)

    def _col(self, da: int) -> int:
        return self.grid.rank_of(self.grid.a + da, self.grid.b)

    def _shift_a(self, t: torch.Tensor, tag: int) -> tuple[torch.Tensor, list]:
        """Post: send ``t`` to the left neighbour of the row, receive from the right one."""
        if self.grid.cp1 == 1:
            return t, []
        buf = torch.empty_like(t)
        return buf, exchange([(self._row(-1), t)], [(self._row(1), buf)], tag)

    def _shift_b(self, t: torch.Tensor, tag: int) -> tuple[torch.Tensor, list]:
        if self.grid.cp0 == 1:
            return t, []
        buf = torch.empty_like(t)
        return buf, exchange([(self._col(-1), t)], [(self._col(1), buf)], tag)

    def run(self, a_ro: torch.Tensor, b_ro: torch.Tensor, fn: Callable[..., None],
            a_acc: torch.Tensor | None = None, b_acc: torch.Tensor | None = None) -> tuple[Any, Any]:
        """Walk. ``fn(a_tile, b_tile, piece, a_acc, b_acc)``; returns the accumulators of this
        rank's own (home) tiles, summed over every rank that used them (None when not given)."""
        a_cur = permute(a_ro.contiguous(), self._row(-self.a_skew), self._row(self.a_skew))
        b_cur = permute(b_ro.contiguous(), self._col(-self.b_skew), self._col(self.b_skew))
        remaining_a = sum(pc.a_shift for pc in self.pieces)
        remaining_b = sum(pc.b_shift for pc in self.pieces)
        a_next, a_reqs = self._shift_a(a_cur, TAG_RO) if remaining_a else (None, [])
        b_next, b_reqs = self._shift_b(b_cur, TAG_RO) if remaining_b else (None, [])
        for pc in self.pieces:
            if pc.a_shift:
                wait_all(a_reqs)
                a_cur, remaining_a = a_next, remaining_a - 1
                if a_acc is not None:  # the accumulator leaves only after its last use here
                    a_acc, acc_reqs = self._shift_a(a_acc, TAG_ACC)
                    wait_all(acc_reqs)
                a_next, a_reqs = self._shift_a(a_cur, TAG_RO) if remaining_a else (None, [])
            if pc.b_shift:
                wait_all(b_reqs)
                b_cur, remaining_b = b_next, remaining_b - 1
                if b_acc is not None:
                    b_acc, acc_reqs = self._shift_b(b_acc, TAG_ACC)
                    wait_all(acc_reqs)
                b_next, b_reqs = self._shift_b(b_cur, TAG_RO) if remaining_b else (None, [])
            fn(a_cur, b_cur, pc, a_acc, b_acc)
        if a_acc is not None:
            a_acc = permute(a_acc, self._row(self.a_end), self._row(-self.a_end), TAG_ACC)
        if b_acc is not None:
            b_acc = permute(b_acc, self._col(self.b_end), self._col(-self.b_end), TAG_ACC)
        return a_acc, b_acc
