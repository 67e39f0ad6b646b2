"""The 2d process grid of issue 6: who holds which tile, and the point-to-point moves between tiles.

We say *axis* for a grid (DeviceMesh) axis and *dim* for a tensor dimension. The grid is
``cp0 x cp1`` (DeviceMesh ``("cp0", "cp1")``, row-major ranks); rank ``(a, b)`` holds the tile
``X[R_a, C_b]`` of every pair-shaped tensor, ``R_a = [a·N/cp0, (a+1)·N/cp0)`` and
``C_b = [b·N/cp1, (b+1)·N/cp1)``; ``N`` is padded to a multiple of ``lcm(cp0, cp1)``.

Moves (all point-to-point, ``batch_isend_irecv``; bytes counted in ``comm.BYTES``):

* ``transpose_tiles``: the tile of ``X^T`` (``X^T[R_a, C_b] = X[C_b, R_a]^T``). Square grids:
  one swap with rank ``(b, a)``; non-square: the pieces of ``X[C_b, R_a]`` from every rank whose
  tile overlaps it. A permutation of elements, so its backward is itself.
* ``RingWalk``: the generalised Cannon schedule (below) that streams "A-side" tiles along a
  grid row and "B-side" tiles along a grid column so that every rank sees every k-range once.

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

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from cpbench.models.pairformer import chunking, comm

_TAG_SKEW, _TAG_RO, _TAG_ACC = 1, 2, 3


@dataclass(frozen=True)
class Grid:
    """This rank's place in the ``cp0 x cp1`` grid.

    Attributes:
        cp0, cp1: grid shape (rows of tiles, columns of tiles).
        a, b: this rank's grid coordinates.
        ranks: global rank of every grid position, ``ranks[a][b]``.
        row_group: process group of grid row ``a`` (the ``cp1`` ranks ``(a, *)``).
        col_group: process group of grid column ``b`` (the ``cp0`` ranks ``(*, b)``).
    """

    cp0: int
    cp1: int
    a: int
    b: int
    ranks: tuple[tuple[int, ...], ...]
    row_group: Any = None
    col_group: Any = None

    @property
    def units(self) -> int:
        """Token padding unit: both grid axes divide it."""
        return math.lcm(self.cp0, self.cp1)

    def rank_of(self, a: int, b: int) -> int:
        """Global rank of grid position ``(a mod cp0, b mod cp1)``."""
        return self.ranks[a % self.cp0][b % self.cp1]

    @property
    def me(self) -> int:
        return self.rank_of(self.a, self.b)

    def rows(self, n_pad: int) -> slice:
        """``R_a``: global token rows of this rank's tiles."""
        return _block(self.a, self.cp0, n_pad)

    def cols(self, n_pad: int) -> slice:
        """``C_b``: global token columns of this rank's tiles."""
        return _block(self.b, self.cp1, n_pad)


def _block(i: int, parts: int, n: int) -> slice:
    size = n // parts
    return slice(i * size, (i + 1) * size)


def _overlap(x: slice, y: slice) -> slice | None:
    lo, hi = max(x.start, y.start), min(x.stop, y.stop)
    return slice(lo, hi) if lo < hi else None


def grid_from_mesh(mesh: Any) -> Grid:
    """The ``Grid`` of a 2-D DeviceMesh ``("cp0", "cp1")`` (row groups = the cp1 axis)."""
    cp0, cp1 = mesh.shape
    coord = mesh.get_coordinate()
    ranks = tuple(tuple(int(r) for r in row) for row in mesh.mesh.tolist())
    return Grid(cp0, cp1, coord[0], coord[1], ranks, row_group=mesh.get_group(1), col_group=mesh.get_group(0))


# ---------------------------------------------------------------------------------------------
# Point-to-point primitives


def _exchange(sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]], tag: int) -> list:
    """Post ``sends`` (peer, tensor) and ``recvs`` (peer, buffer); returns the requests."""
    ops = [dist.P2POp(dist.isend, t, peer, tag=tag) for peer, t in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, tag=tag) for peer, t in recvs]
    for _, t in sends:
        comm.BYTES.add(t.numel() * t.element_size())
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(reqs: list) -> None:
    for r in reqs:
        r.wait()


def permute(t: torch.Tensor, send_to: int, recv_from: int, tag: int = _TAG_SKEW) -> torch.Tensor:
    """Send ``t`` to global rank ``send_to`` and return the same-shaped tensor from ``recv_from``
    (``t`` itself when both are this rank); blocking."""
    if send_to == recv_from == dist.get_rank():
        return t
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    _wait(_exchange([(send_to, t.contiguous())], [(recv_from, out)], tag))
    return out


def _transpose_into(out: torch.Tensor, t: torch.Tensor, grid: Grid, dim: int) -> torch.Tensor:
    """``out`` <- tile of ``X^T`` from the tile ``t`` of ``X`` (token dims ``dim``, ``dim + 1``).

    ``out`` may be ``t`` itself: every outgoing piece is copied out before anything is written.
    """
    p, q = grid.cp0, grid.cp1
    n_pad = t.shape[dim] * p
    rows, cols = grid.rows(n_pad), grid.cols(n_pad)

    def region(x: torch.Tensor, r: slice, c: slice) -> torch.Tensor:
        return x.narrow(dim, r.start, r.stop - r.start).narrow(dim + 1, c.start, c.stop - c.start)

    def local(x: slice, origin: slice) -> slice:
        return slice(x.start - origin.start, x.stop - origin.start)

    sends, recvs, places = [], [], []
    for a2 in range(p):
        for b2 in range(q):
            peer = grid.rank_of(a2, b2)
            peer_rows, peer_cols = _block(a2, p, n_pad), _block(b2, q, n_pad)
            # Mine -> peer: X[R_a ∩ C_b2, C_b ∩ R_a2], transposed, lands at peer rows C_b ∩ R_a2.
            rs, cs = _overlap(rows, peer_cols), _overlap(cols, peer_rows)
            if rs is not None and cs is not None:
                piece = region(t, local(rs, rows), local(cs, cols)).transpose(dim, dim + 1)
                piece = piece.clone(memory_format=torch.contiguous_format)
                if peer == grid.me:
                    places.append((region(out, local(cs, rows), local(rs, cols)), piece))
                else:
                    sends.append((peer, piece))
            # Peer -> mine: X[R_a2 ∩ C_b, C_b2 ∩ R_a] transposed, at my rows C_b2 ∩ R_a, cols R_a2 ∩ C_b.
            my_r, my_c = _overlap(peer_cols, rows), _overlap(peer_rows, cols)
            if peer != grid.me and my_r is not None and my_c is not None:
                dst = region(out, local(my_r, rows), local(my_c, cols))
                if dst.is_contiguous():  # square grids: the whole tile, received in place
                    recvs.append((peer, dst))
                else:
                    buf = torch.empty(dst.shape, dtype=t.dtype, device=t.device)
                    recvs.append((peer, buf))
                    places.append((dst, buf))
    _wait(_exchange(sends, recvs, _TAG_SKEW))
    for dst, buf in places:
        dst.copy_(buf)
    return out


def _transpose_tiles(t: torch.Tensor, grid: Grid, dim: int) -> torch.Tensor:
    return _transpose_into(torch.empty_like(t, memory_format=torch.contiguous_format), t, grid, dim)


def agreed_chunk(n: int, like: torch.Tensor, group: Any) -> int:
    """The smallest of every rank's chunk size ``n``: point-to-point steps pair ranks up, so
    every rank must cut its work the same way (on CUDA budgets come from each rank's free
    memory; on CPU they depend on shapes only)."""
    if not like.is_cuda:
        return n
    t = torch.tensor([n], device=like.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


def transpose_tiles_(z: torch.Tensor, grid: Grid, group: Any) -> torch.Tensor:
    """In-place ``transpose_tiles`` of a pair tile ``z: [N/cp0, N/cp1, c]`` without autograd,
    in channel chunks so that only two chunk-sized buffers are transient."""
    c = z.shape[-1]
    per_channel_b = 2 * z.numel() // c * z.element_size()
    ck = chunking.divisor_chunk(c, per_channel_b, chunking.budget_bytes(z))
    ck = agreed_chunk(ck, z, group)
    while c % ck:  # the agreed minimum divides c only if it is one of ours
        ck -= 1
    for cs in chunking.slices(c, ck):
        view = z[..., cs]
        _transpose_into(view, view, grid, 0)
    return z


class _TransposeTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, grid: Grid, dim: int) -> torch.Tensor:
        ctx.grid, ctx.dim = grid, dim
        return _transpose_tiles(t, grid, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _transpose_tiles(grad.contiguous(), ctx.grid, ctx.dim), None, None


def transpose_tiles(t: torch.Tensor, grid: Grid, dim: int = 0) -> torch.Tensor:
    """This rank's tile of ``X^T`` given its tile of ``X``.

    Args:
        t: ``[..., N/cp0, N/cp1, ...]`` tile ``X[R_a, C_b]`` with token dims ``dim, dim + 1``.
    Returns:
        Same shape: ``X^T[R_a, C_b]``, a new tensor. Sends ``|t|`` bytes (less the part that
        stays on this rank); autograd-aware (the backward is the same exchange).
    """
    if torch.is_grad_enabled() and t.requires_grad:
        return _TransposeTiles.apply(t, grid, dim)
    return _transpose_tiles(t, grid, dim)


# ---------------------------------------------------------------------------------------------
# Generalised Cannon walk


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
        return buf, _exchange([(self._row(-1), t)], [(self._row(1), buf)], tag)

    def _shift_b(self, t: torch.Tensor, tag: int) -> tuple[torch.Tensor, list]:
        if self.grid.cp0 == 1:
            return t, []
        buf = torch.empty_like(t)
        return buf, _exchange([(self._col(-1), t)], [(self._col(1), buf)], tag)

    def run(self, a_ro: torch.Tensor, b_ro: torch.Tensor, fn: Callable[..., None],
            a_acc: torch.Tensor | None = None, b_acc: torch.Tensor | None = None) -> tuple[Any, Any]:
        """Walk. ``fn(a_tile, b_tile, piece, a_acc, b_acc)``; returns the accumulators of this
        rank's own (home) tiles, summed over every rank that used them (None when not given)."""
        a_cur = permute(a_ro.contiguous(), self._row(-self.a_skew), self._row(self.a_skew))
        b_cur = permute(b_ro.contiguous(), self._col(-self.b_skew), self._col(self.b_skew))
        remaining_a = sum(pc.a_shift for pc in self.pieces)
        remaining_b = sum(pc.b_shift for pc in self.pieces)
        a_next, a_reqs = self._shift_a(a_cur, _TAG_RO) if remaining_a else (None, [])
        b_next, b_reqs = self._shift_b(b_cur, _TAG_RO) if remaining_b else (None, [])
        for pc in self.pieces:
            if pc.a_shift:
                _wait(a_reqs)
                a_cur, remaining_a = a_next, remaining_a - 1
                if a_acc is not None:  # the accumulator leaves only after its last use here
                    a_acc, acc_reqs = self._shift_a(a_acc, _TAG_ACC)
                    _wait(acc_reqs)
                a_next, a_reqs = self._shift_a(a_cur, _TAG_RO) if remaining_a else (None, [])
            if pc.b_shift:
                _wait(b_reqs)
                b_cur, remaining_b = b_next, remaining_b - 1
                if b_acc is not None:
                    b_acc, acc_reqs = self._shift_b(b_acc, _TAG_ACC)
                    _wait(acc_reqs)
                b_next, b_reqs = self._shift_b(b_cur, _TAG_RO) if remaining_b else (None, [])
            fn(a_cur, b_cur, pc, a_acc, b_acc)
        if a_acc is not None:
            a_acc = permute(a_acc, self._row(self.a_end), self._row(-self.a_end), _TAG_ACC)
        if b_acc is not None:
            b_acc = permute(b_acc, self._col(self.b_end), self._col(-self.b_end), _TAG_ACC)
        return a_acc, b_acc
