"""Per-rank memory of the 2d trunk scales as 1/P: one block's inference peak on a 2x2 grid is at
most 0.35x the cp=1 peak at the same N, where pair memory dominates (measured with torch's own
accounting, ``torch.distributed._tools.mem_tracker.MemTracker``, on CPU, as the 1d test does)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import layout_from_mesh, serial_layout

from helpers.dist import run_distributed
from helpers.parity import peak_bytes

N, C_S, C_Z = 128, 32, 32  # pair tensor 2 MiB at cp=1 (fp32), 0.5 MiB tiles on 2x2, ~0.2 MiB of weights



def _memory_worker(rank: int, world: int) -> dict:
    # The rule under test is the budget's quarter of the shard; at this N the CPU floor
    # (chunking._CPU_FLOOR_BYTES, for speed) would set both layouts' budgets instead.
    chunking._CPU_FLOOR_BYTES = 64 << 10  # this worker process only
    torch.manual_seed(0)
    block = PairformerBlock(C_S, C_Z, heads_single=2, heads_tri=2, head_dim_tri=8, transition_factor=2)
    mask = torch.rand(N) > 0.1
    grid = layout_from_mesh(init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp0", "cp1")))
    peaks = {}
    for name, layout in (("cp1", serial_layout()), ("2x2", grid)):
        rows, cols = layout.rows(N), layout.cols(N)
        z = torch.randn(rows.stop - rows.start, cols.stop - cols.start, C_Z)
        peaks[name] = peak_bytes(block, torch.randn(rows.stop - rows.start, C_S), z, mask, layout)
        peaks[name + "_pair"] = z.numel() * z.element_size()
    return peaks


def test_cp2d_block_peak_per_rank_on_2x2_grid_is_at_most_0_35_of_cp1():
    for rank, peaks in enumerate(run_distributed(_memory_worker, 4, timeout_s=180)):
        assert peaks["2x2_pair"] * 4 == peaks["cp1_pair"]  # the rank held a quarter tile
        assert peaks["cp1"] > 2 * peaks["cp1_pair"] > 0  # the tracker saw the pair tensor and its work buffers
        assert peaks["2x2"] <= 0.35 * peaks["cp1"], (rank, peaks)
