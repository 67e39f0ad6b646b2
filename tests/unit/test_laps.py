"""Per-block times without a host-device synchronisation per block (``stage_timer.Laps``)."""

from __future__ import annotations

import time

import torch

from cpbench.models.pairformer import stage_timer
from cpbench.models.pairformer.adapter import PairformerAdapter


class FakeEvent:
    """A CUDA timing event whose ``record`` takes the host clock (ms) as its GPU time."""

    synced = 0

    def __init__(self, enable_timing=True):
        assert enable_timing
        self.t_ms = None

    def record(self):
        self.t_ms = time.perf_counter() * 1e3

    def synchronize(self):
        FakeEvent.synced += 1

    def elapsed_time(self, other):
        return other.t_ms - self.t_ms


def test_cpu_laps_give_one_duration_per_span():
    laps = stage_timer.Laps("cpu")
    assert laps.ms() == []
    start = time.perf_counter()
    laps.mark()
    for pause_s in (0.002, 0.0, 0.004):
        time.sleep(pause_s)
        laps.mark()
    total_ms = (time.perf_counter() - start) * 1e3
    ms = laps.ms()
    assert len(ms) == 3 and all(m >= 0 for m in ms)
    assert ms[0] >= 2.0 and ms[2] >= 4.0 and sum(ms) <= total_ms + 1e-6


def test_cuda_laps_never_synchronise_the_device(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a lap drained the launch queue")

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    FakeEvent.synced = 0
    laps = stage_timer.Laps("cuda")
    for _ in range(5):
        laps.mark()
    assert FakeEvent.synced == 0
    ms = laps.ms()
    assert len(ms) == 4 and FakeEvent.synced == 1  # one wait, on the last event, when read


def test_the_trunk_times_each_block_it_ran():
    adapter = PairformerAdapter(c_s=16, c_z=8, blocks=3, heads_single=2, heads_tri=2, head_dim_tri=4,
                                transition_factor=2, dtype="fp32", c_atom=8, c_atompair=4, atom_blocks=1,
                                atom_heads=2, c_m=8, msa_blocks=0)
    torch.manual_seed(0)
    model = adapter.build_model(None, torch.device("cpu"))
    assert model.block_ms == []
    batch = adapter.build_batch(16, 48, 4, None, torch.device("cpu"))
    adapter.run_step(model, batch, train=False)
    assert len(model.block_ms) == 3
    assert adapter.stats()["stage_ms"]["block_mean"] == sum(model.block_ms) / 3
    adapter.run_step(model, batch, train=False, run_blocks=2)
    assert len(model.block_ms) == 2
