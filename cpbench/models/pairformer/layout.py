"""How the pair and single representations are sharded over the CP group: one small object.

Every op of the trunk takes its local shard plus a ``Layout`` and dispatches on ``layout.kind``:

* ``serial``: one rank holds everything: ``z: [N, N, c_z]``, ``s: [N, c_s]``.
* ``1d`` (DAP): rank ``r`` of ``P`` holds rows ``[r*N/P, (r+1)*N/P)``: ``z: [N/P, N, c_z]``,
  ``s: [N/P, c_s]``; ``N`` is padded to a multiple of ``P`` (``padding.py``).

A 2d layout (issue 6) adds its kind here and its sharded implementations beside the 1d ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

SERIAL = "serial"
ONE_D = "1d"


@dataclass(frozen=True)
class Layout:
    """Sharding of the trunk's tensors.

    Attributes:
        kind: ``"serial"`` or ``"1d"``.
        group: the CP process group (None when serial).
        rank: this rank's index in ``group``.
        size: ``P``, ranks in ``group``.
    """

    kind: str = SERIAL
    group: Any = None
    rank: int = 0
    size: int = 1

    @property
    def sharded(self) -> bool:
        """Whether collectives are needed (a 1d layout of one rank runs the serial code)."""
        return self.kind != SERIAL and self.size > 1

    def rows(self, n_pad: int) -> slice:
        """Global token rows this rank holds, of ``n_pad`` padded tokens."""
        n_local = n_pad // self.size
        return slice(self.rank * n_local, (self.rank + 1) * n_local)


def serial_layout() -> Layout:
    return Layout()


def layout_1d(group: Any = None) -> Layout:
    """The 1d layout over ``group`` (the default group when None)."""
    group = group if group is not None else dist.group.WORLD
    return Layout(ONE_D, group, dist.get_rank(group), dist.get_world_size(group))


def layout_from_mesh(mesh: Any) -> Layout:
    """The layout of a DeviceMesh: None or one rank -> serial; 1-D ``("cp",)`` -> 1d."""
    if mesh is None or mesh.size() == 1:
        return serial_layout()
    if mesh.ndim != 1:
        raise ValueError(f"topology=2d: the reference trunk implements 1d only so far (mesh {tuple(mesh.shape)})")
    return layout_1d(mesh.get_group())
