"""The Fold-CP trunk's inputs: the same global tensors at any cp, each rank drawing only its tile.

Global inputs at N tokens, padded to ``N_pad`` = the next multiple of the grid side ``g`` (Fold-CP
shards evenly; padding tokens have zero features and zero masks, so they change no real output):

* ``s: [1, N_pad, c_s]`` and ``mask: [1, N_pad]``: single representation and token mask;
* ``z: [1, N_pad, N_pad, c_z]`` and ``pair_mask: [1, N_pad, N_pad]``: pair representation and mask.

Values: ``s`` is one seeded draw (it is small; every rank draws it whole and keeps its rows).
Row ``i`` of ``z`` is a draw of its own, seeded ``seed + 1 + i``: a rank draws its rows one at a time
and keeps its columns, so it never holds more than its tile plus one row, and the global ``z`` is
the same whatever the grid (cp=1 and cp=4 see one input). ``s``/``z`` come in the dtype the
embedder hands them over in (bf16 under ``dtype=bf16``, else fp32); masks are fp32.

Per rank at grid coordinates ``(i, j)`` of a ``g x g`` grid (``n = N_pad / g``), as Fold-CP places
its features (``INFERENCE_FEATURE_PLACEMENTS_V2``: ``token_pad_mask`` and ``token_pair_pad_mask``)
and batches them (``CollateDTensor``) on the mesh ``(dp, cp_axis_0, cp_axis_1)``:

* ``s``, ``mask``: ``(Shard(0), Shard(1), Replicate())``, local ``[1, n, c_s]`` / ``[1, n]`` (rows of block i);
* ``z``, ``pair_mask``: ``(Shard(0), Shard(1), Shard(2))``, local ``[1, n, n, c_z]`` / ``[1, n, n]`` (tile (i, j)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

SINGLE_FEATURE = "token_pad_mask"       # Fold-CP's placement of a token feature
PAIR_FEATURE = "token_pair_pad_mask"    # and of a token-pair feature


@dataclass
class FoldCPBatch:
    """The trunk's inputs (DTensors on Fold-CP's mesh; shapes in the module docstring)."""

    s: Any
    z: Any
    mask: Any
    pair_mask: Any
    n_tokens: int        # N, the real tokens
    n_padded: int        # N_pad


def padded_tokens(n_tokens: int, grid_side: int) -> int:
    """``N_pad``: ``n_tokens`` rounded up to a multiple of ``grid_side``."""
    return math.ceil(n_tokens / grid_side) * grid_side


def draw_tile(n_tokens: int, n_padded: int, rows: range, cols: range, c_s: int, c_z: int, seed: int,
              dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's tile of the global inputs, unbatched: ``s [r, c_s]``, ``mask [r]`` (token rows
    ``rows``), ``z [r, c, c_z]``, ``pair_mask [r, c]`` (rows ``rows`` x columns ``cols``, both
    contiguous ranges of the ``n_padded`` token axis); tokens from ``n_tokens`` on are padding (zeros)."""
    real = (torch.arange(n_padded, device=device) < n_tokens).float()
    g = torch.Generator(device).manual_seed(seed)
    s = torch.zeros(n_padded, c_s, device=device)
    s[:n_tokens] = torch.randn(n_tokens, c_s, generator=g, device=device)
    z = torch.zeros(len(rows), len(cols), c_z, dtype=dtype, device=device)
    real_cols = range(cols.start, min(cols.stop, n_tokens))
    for k, i in enumerate(rows):
        if i >= n_tokens or not real_cols:
            break  # rows ascend: the rest are padding
        g.manual_seed(seed + 1 + i)
        z[k, :len(real_cols)] = torch.randn(n_tokens, c_z, generator=g, device=device)[real_cols.start:real_cols.stop]
    return {"s": s[rows.start:rows.stop].to(dtype), "mask": real[rows.start:rows.stop].contiguous(), "z": z,
            "pair_mask": (real[rows.start:rows.stop, None] * real[None, cols.start:cols.stop]).contiguous()}


def build_foldcp_batch(manager: Any, n_tokens: int, c_s: int, c_z: int, seed: int, dtype: torch.dtype,
                       device: torch.device) -> FoldCPBatch:
    """The inputs as DTensors on ``manager.device_mesh_subgroups``, through Fold-CP's placements
    and its collate (see the module docstring)."""
    from boltz.distributed.data.module.placements import INFERENCE_FEATURE_PLACEMENTS_V2
    from boltz.distributed.data.utils import CollateDTensor
    from torch.distributed.tensor import DTensor

    mesh = manager.device_mesh_subgroups
    side = mesh.shape[1]
    n_padded = padded_tokens(n_tokens, side)
    n = n_padded // side
    _, i, j = mesh.get_coordinate()
    tile = draw_tile(n_tokens, n_padded, range(i * n, (i + 1) * n), range(j * n, (j + 1) * n), c_s, c_z, seed,
                     dtype, device)
    cp_mesh = mesh["cp_axis_0", "cp_axis_1"]
    placements = {"s": INFERENCE_FEATURE_PLACEMENTS_V2[SINGLE_FEATURE], "mask": INFERENCE_FEATURE_PLACEMENTS_V2[SINGLE_FEATURE],
                  "z": INFERENCE_FEATURE_PLACEMENTS_V2[PAIR_FEATURE], "pair_mask": INFERENCE_FEATURE_PLACEMENTS_V2[PAIR_FEATURE]}
    sample = {key: DTensor.from_local(tile.pop(key), cp_mesh, placements[key], run_check=False) for key in list(tile)}
    batch = CollateDTensor(mesh)([sample])  # adds the batch dim, sharded over dp
    del sample
    return FoldCPBatch(s=batch["s"], z=batch["z"], mask=batch["mask"], pair_mask=batch["pair_mask"],
                       n_tokens=n_tokens, n_padded=n_padded)
