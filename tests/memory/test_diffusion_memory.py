"""Per-rank memory of the diffusion module (conditioning + one denoiser call, no autograd):
the pair-derived terms live in the local pair shard only, so the peak at cp=2 is at most 0.6x
the cp=1 peak, and no ``N x N x (layers·heads)`` bias is ever materialised (measured with
torch's own accounting, ``torch.distributed._tools.mem_tracker.MemTracker``, on CPU)."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from cpbench.data.sharding import pad_features
from cpbench.data.synthetic import make_synthetic_features
from cpbench.models.pairformer.modules.diffusion import DiffusionModule
from cpbench.models.pairformer.parallel.layout import layout_1d, serial_layout

from helpers.dist import run_distributed

N, C_S, C_Z = 256, 16, 32  # pair shard 8 MiB at cp=1 (fp32); weights and atom terms far smaller
# 4 token blocks x 16 heads = 64 bias channels: one N x N x (layers·heads) tensor would be 2x the pair.
SIZES = dict(c_token=32, blocks=4, heads=16, c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_fourier=8)
SAMPLES = 2


class _PrepareAndDenoise(torch.nn.Module):
    """One top-level module call (MemTracker attributes repeated submodule calls to a parent)."""

    def __init__(self, module: DiffusionModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, s, z, s_inputs, feats, layout) -> torch.Tensor:
        ctx = self.module.prepare(s, z, s_inputs, feats, layout)
        x = 50 * torch.randn(SAMPLES, ctx.local.stop - ctx.local.start, 3)
        return self.module(x, torch.tensor([80.0, 20.0]), ctx)


def _peak_b(module: DiffusionModule, s, z, s_inputs, feats, layout) -> int:
    run = _PrepareAndDenoise(module)
    tracker = MemTracker()
    tracker.track_external(run)
    with tracker, torch.no_grad():
        run(s, z, s_inputs, feats, layout)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def _memory_worker(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    module = DiffusionModule(C_S, C_Z, **SIZES)
    g = torch.Generator().manual_seed(1)
    feats, _ = pad_features(make_synthetic_features(N, 2 * N, 1, g), units=world)
    s_inputs = torch.randn(N, C_S)
    peaks = {}
    for name, layout in (("cp1", serial_layout()), ("cp2", layout_1d())):
        rows = layout.rows(N)
        z = torch.randn(rows.stop - rows.start, N, C_Z)
        peaks[name + "_pair"] = z.numel() * z.element_size()
        peaks[name] = _peak_b(module, torch.randn(rows.stop - rows.start, C_S), z, s_inputs, feats, layout)
    return peaks


def test_diffusion_peak_per_rank_at_cp2_is_at_most_0_6_of_cp1_without_a_layers_heads_bias():
    layers_heads_bias_b = N * N * SIZES["blocks"] * SIZES["heads"] * 4
    for rank, peaks in enumerate(run_distributed(_memory_worker, 2, timeout_s=180)):
        assert peaks["cp1"] > peaks["cp1_pair"] > 0, (rank, peaks)  # the tracker saw the pair shard
        assert peaks["cp1"] < peaks["cp1_pair"] + layers_heads_bias_b, (rank, peaks)
        assert peaks["cp2"] <= 0.6 * peaks["cp1"], (rank, peaks)
