"""How the pair and single representations are sharded over the CP group: one small object.

Every op of the trunk takes its local shard plus a ``Layout`` and dispatches on ``layout.kind``:

* ``serial``: one rank holds everything: ``z: [N, N, c_z]``, ``s: [N, c_s]``.
* ``1d`` (DAP): rank ``r`` of ``P`` holds rows ``[r*N/P, (r+1)*N/P)``: ``z: [N/P, N, c_z]``,
  ``s: [N/P, c_s]``; ``N`` is padded to a multiple of ``P`` (``padding.py``).

* ``2d`` (``grid.py``): rank ``(a, b)`` of a ``cp0 x cp1`` grid holds the tile
  ``z: [N/cp0, N/cp1, c_z]`` (rows ``R_a``, columns ``C_b``) and the single representation of
  its tile rows, ``s: [N/cp0, c_s]``, replicated over the ``cp1`` ranks of its grid row; ``N``
  is padded to a multiple of ``lcm(cp0, cp1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from cpbench.models.pairformer.parallel.grid import Grid, grid_from_mesh

SERIAL = "serial"
ONE_D = "1d"
TWO_D = "2d"


@dataclass(frozen=True)
class Layout:
    """Sharding of the trunk's tensors.

    Attributes:
        kind: ``"serial"``, ``"1d"`` or ``"2d"``.
        group: the CP process group (None when serial; 2d: the whole grid).
        rank: this rank's index in ``group``.
        size: ``P``, ranks in ``group``.
        grid: 2d only, this rank's ``grid.Grid`` (shape, coordinates, row / column groups).
    """

    kind: str = SERIAL
    group: Any = None
    rank: int = 0
    size: int = 1
    grid: Grid | None = None

    @property
    def sharded(self) -> bool:
        """Whether collectives are needed (a 1d layout of one rank runs the serial code)."""
        return self.kind != SERIAL and self.size > 1

    def rows(self, n_pad: int) -> slice:
        """Global token rows this rank holds, of ``n_pad`` padded tokens."""
        if self.grid is not None:
            return self.grid.rows(n_pad)
        n_local = n_pad // self.size
        return slice(self.rank * n_local, (self.rank + 1) * n_local)

    def cols(self, n_pad: int) -> slice:
        """Global token columns of this rank's pair shard (all but in 2d)."""
        return self.grid.cols(n_pad) if self.grid is not None else slice(0, n_pad)

    @property
    def units(self) -> int:
        """Tokens are padded to a multiple of this: ``P``, or ``lcm(cp0, cp1)`` in 2d."""
        return self.grid.units if self.grid is not None else self.size

    def single_axis(self) -> "Layout":
        """The 1d layout that shards token-indexed (O(N)) work such as the atom encoder: this
        layout itself, or in 2d the grid column (``cp0`` ranks; rank ``(a, b)`` holds tokens
        ``R_a``, like every rank of its grid row)."""
        if self.grid is None:
            return self
        return Layout(ONE_D, self.grid.col_group, self.grid.a, self.grid.cp0)

    def row_axis(self) -> "Layout":
        """2d: the 1d layout over this rank's grid row (the ``cp1`` ranks ``(a, *)``), so that
        ``comm``'s collectives run along it (the ``single_axis`` runs along the grid column)."""
        return Layout(ONE_D, self.grid.row_group, self.grid.b, self.grid.cp1)

    @property
    def owns_single(self) -> bool:
        """Whether this rank's ``s`` counts in global sums (2d: one rank per grid row)."""
        return self.grid is None or self.grid.b == 0


def serial_layout() -> Layout:
    return Layout()


def layout_1d(group: Any = None) -> Layout:
    """The 1d layout over ``group`` (the default group when None)."""
    group = group if group is not None else dist.group.WORLD
    return Layout(ONE_D, group, dist.get_rank(group), dist.get_world_size(group))


def layout_from_mesh(mesh: Any) -> Layout:
    """The layout of a DeviceMesh: None or one rank -> serial; 1-D ``("cp",)`` -> 1d;
    2-D ``("cp0", "cp1")`` -> 2d."""
    if mesh is None or mesh.size() == 1:
        return serial_layout()
    if mesh.ndim == 2:
        return layout_2d(mesh)
    return layout_1d(mesh.get_group())


def layout_2d(mesh: Any) -> Layout:
    """The 2d layout of a 2-D DeviceMesh ``("cp0", "cp1")``; the whole-grid group is the default
    group when the mesh spans it (the harness), else the mesh's flattened group."""
    group = dist.group.WORLD if mesh.size() == dist.get_world_size() else mesh._flatten().get_group()
    return Layout(TWO_D, group, dist.get_rank(group), mesh.size(), grid_from_mesh(mesh))
