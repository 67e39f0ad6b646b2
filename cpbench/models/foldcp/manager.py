"""cpbench's 2D mesh mapped onto Fold-CP's ``DistributedManager`` (dims dp x cp_axis_0 x cp_axis_1).

We say *axis* for a DeviceMesh axis and *dim* for a tensor dimension. cpbench's worker has joined
the process group and built the mesh ``("cp0", "cp1")`` of shape ``(cp0, cp1)`` before the adapter
runs, with the ranks laid out row-major (rank = i * cp1 + j), which is Fold-CP's layout
(``LayoutRightMap``: the last axis's ranks are contiguous). Fold-CP's layers read their mesh and
groups from its manager, a Borg singleton whose ``initialize`` always calls
``init_process_group`` itself (a second call in the process raises). So ``foldcp_manager``
records the running process group in the manager's shared state, as its ``_setup`` would have
after that call, and then lets Fold-CP build its own meshes and groups with its public
``create_grid_group({"dp": 1, "cp": (cp0, cp1)})``:

* ``device_mesh_subgroups``: the mesh ``("dp", "cp_axis_0", "cp_axis_1")`` of shape ``(1, cp0, cp1)``,
  the one its DTensors live on; ``device_mesh``: ``("dp", "cp")`` of shape ``(1, cp)``;
* ``group["cp"]`` (all cp ranks), ``subgroups["cp"]`` (the two axis groups) and
  ``layout_subgroups["cp"]`` (grid coordinates <-> rank), which its ring communicators take.

Fold-CP itself is not changed. Under emulation (torch's fake process group) the manager is told
the backend Fold-CP would pick for the device (its check accepts nccl or gloo only); every
collective still goes through the fake group.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist

# cpbench's mesh axis names for topology=2d (cpbench/config.py: mesh_for).
MESH_DIM_NAMES_2D = ("cp0", "cp1")


def grid_of(mesh: Any) -> tuple[int, int]:
    """The ``(cp0, cp1)`` grid of cpbench's 2D mesh (a one-rank mesh of either topology: 1x1);
    refuses any other mesh in one line."""
    names = tuple(mesh.mesh_dim_names or ())
    if mesh.mesh.numel() == 1:
        return 1, 1
    if names != MESH_DIM_NAMES_2D:
        raise ValueError(f"mesh axes {names}: Fold-CP's trunk runs on cpbench's 2D mesh {MESH_DIM_NAMES_2D} (topology=2d)")
    cp0, cp1 = (int(n) for n in mesh.mesh.shape)
    if cp0 != cp1:
        raise ValueError(f"mesh {cp0}x{cp1}: Fold-CP's 2D CP grid is square (cp a perfect square)")
    ranks = mesh.mesh.flatten().tolist()
    if ranks != list(range(dist.get_world_size())):
        raise ValueError(f"mesh ranks {ranks}: Fold-CP's grid covers the whole process group, row-major")
    return cp0, cp1


def foldcp_manager(mesh: Any, device: torch.device) -> Any:
    """Fold-CP's ``DistributedManager`` on the running process group, grid ``dp=1 x cp0 x cp1``.

    Args:
        mesh: cpbench's DeviceMesh ``("cp0", "cp1")``, square, over every rank.
        device: this rank's device (``cuda:k`` or ``cpu``).

    Returns:
        The manager (every rank holds the same grid); a second call returns it unchanged.
    """
    from boltz.distributed.manager import DistributedManager

    cp0, cp1 = grid_of(mesh)
    if DistributedManager.is_initialized():
        manager = DistributedManager()
        if len(manager.group_ranks.get("cp", [])) != cp0 * cp1:
            raise RuntimeError(f"Fold-CP's manager already holds a cp group of {len(manager.group_ranks.get('cp', []))} "
                               f"ranks, not {cp0 * cp1}")
        return manager
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # What DistributedManager._setup records right after its init_process_group call.
    DistributedManager._state.update({
        "_initialized": True, "_has_dist": True, "_rank": rank, "_world_size": world_size,
        "_local_rank": device.index or 0, "_node_rank": 0, "_device": device,
        "_backend": DistributedManager.backend_for_device()[device.type], "_method_init": "ENV",
    })
    manager = DistributedManager()  # fills the defaults of the remaining state
    manager._group["world"] = dist.group.WORLD
    manager._group_rank["world"] = rank
    manager._group_ranks["world"] = dist.get_process_group_ranks(dist.group.WORLD)
    DistributedManager.create_grid_group(OrderedDict([("dp", 1), ("cp", (cp0, cp1))]))
    return manager
