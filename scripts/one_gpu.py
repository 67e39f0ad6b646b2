"""What the one-device scripts (``profile_ops.py``, ``graph_parity.py``) share: a one-rank
process group with its ``("cp",)`` mesh, and the boltz2 trunk-only model and inputs they run
(the reference adapter's defaults are the boltz2 sizes, ``cpbench/conf/model/boltz2.yaml``; trunk only:
no MSA module, no recycling, no sampling). Imported from the scripts' folder."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from cpbench.models.pairformer.adapter import PairformerAdapter

TRUNK_ONLY = dict(msa_blocks=0, recycles=0, sampling=False)


def one_rank_mesh(device: torch.device, port: int) -> Any:
    """A one-rank process group (NCCL on CUDA, gloo on a CPU) and its 1d ``("cp",)`` mesh."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    return init_device_mesh(device.type, (1,), mesh_dim_names=("cp",))


def trunk_setup(n: int, blocks: int, kernels: str, mesh: Any, device: torch.device,
                dtype: str = "bf16", workflow: dict = TRUNK_ONLY) -> tuple[PairformerAdapter, torch.nn.Module, dict]:
    """``(adapter, model, batch)`` of the boltz2 pass (``workflow``: the adapter's workflow
    arguments, trunk only by default) with ``blocks`` blocks at ``n`` tokens (weights from seed 0;
    the job's defaults: 8 atoms per token, S=256)."""
    adapter = PairformerAdapter(**workflow, blocks=blocks, dtype=dtype, kernels=kernels)
    torch.manual_seed(0)
    model = adapter.build_model(mesh, device)
    return adapter, model, adapter.build_batch(n, 8 * n, 256, mesh, device)
