"""The 2d process grid: which rank holds which tile of a pair-shaped tensor.

We say *axis* for a grid (DeviceMesh) axis and *dim* for a tensor dimension. The grid is
``cp0 x cp1`` (DeviceMesh ``("cp0", "cp1")``, row-major ranks); rank ``(a, b)`` holds the tile
``X[R_a, C_b]`` of every pair-shaped tensor, ``R_a = [a·N/cp0, (a+1)·N/cp0)`` and
``C_b = [b·N/cp1, (b+1)·N/cp1)``; ``N`` is padded to a multiple of ``lcm(cp0, cp1)``.

How tiles move is elsewhere: ``transpose.transpose_tiles`` (the tile of ``X^T``) and
``ring.RingWalk`` (the generalised Cannon schedule), both over ``p2p``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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
        return block(self.a, self.cp0, n_pad)

    def cols(self, n_pad: int) -> slice:
        """``C_b``: global token columns of this rank's tiles."""
        return block(self.b, self.cp1, n_pad)


def block(i: int, parts: int, n: int) -> slice:
    size = n // parts
    return slice(i * size, (i + 1) * size)


def overlap(x: slice, y: slice) -> slice | None:
    lo, hi = max(x.start, y.start), min(x.stop, y.stop)
    return slice(lo, hi) if lo < hi else None


def grid_from_mesh(mesh: Any) -> Grid:
    """The ``Grid`` of a 2-D DeviceMesh ``("cp0", "cp1")`` (row groups = the cp1 axis)."""
    cp0, cp1 = mesh.shape
    coord = mesh.get_coordinate()
    ranks = tuple(tuple(int(r) for r in row) for row in mesh.mesh.tolist())
    return Grid(cp0, cp1, coord[0], coord[1], ranks, row_group=mesh.get_group(1), col_group=mesh.get_group(0))
