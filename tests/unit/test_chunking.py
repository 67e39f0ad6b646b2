"""Chunk budgets: the floor that turns a free-memory budget too small to hold an op's rows into
an out-of-memory verdict at once, and only such a budget (CPU and forced budgets never fail)."""

from __future__ import annotations

import pytest
import torch

from cpbench.harness.memory import is_oom
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.chunking import (
    MIN_ROWS_PER_CHUNK,
    ChunkBudgetFloor,
    FreeMemoryBudget,
    divisor_chunk,
    rows_per_chunk,
)

MIB = 1 << 20


def test_a_free_memory_budget_below_one_row_is_out_of_memory():
    with pytest.raises(ChunkBudgetFloor) as info:
        rows_per_chunk(4096, 8 * MIB, FreeMemoryBudget(3 * MIB))
    message = str(info.value)
    assert message.startswith("chunk budget floor: ") and "out of memory at this N" in message
    assert "8.0 MiB per row" in message and "budget 3.0 MiB" in message
    assert is_oom(info.value) and isinstance(info.value, torch.OutOfMemoryError)


def test_the_floor_is_a_few_rows_or_every_row_of_a_short_op():
    budget = FreeMemoryBudget((MIN_ROWS_PER_CHUNK - 1) * MIB)
    with pytest.raises(ChunkBudgetFloor):
        rows_per_chunk(1024, MIB, budget)
    assert rows_per_chunk(MIN_ROWS_PER_CHUNK - 1, MIB, budget) == MIN_ROWS_PER_CHUNK - 1  # all rows fit
    assert rows_per_chunk(1024, MIB, FreeMemoryBudget(MIN_ROWS_PER_CHUNK * MIB)) == MIN_ROWS_PER_CHUNK


def test_halving_a_free_memory_budget_keeps_its_floor():
    half = FreeMemoryBudget(10 * MIB) // 2
    assert isinstance(half, FreeMemoryBudget) and half == 5 * MIB
    with pytest.raises(ChunkBudgetFloor):
        rows_per_chunk(1024, 2 * MIB, half)


def test_plain_budgets_run_one_row_at_a_time_as_before():
    """CPU budgets (a quarter of the pair shard) and forced ones are sizes, not memory readings."""
    assert rows_per_chunk(4096, 8 * MIB, 3 * MIB) == 1
    pair = torch.zeros(16, 32, 8)
    assert not isinstance(chunking.budget_bytes(pair), FreeMemoryBudget)
    with chunking.override_budget(1):
        assert rows_per_chunk(4096, MIB, chunking.budget_bytes(pair)) == 1


@pytest.mark.parametrize("fit_rows", [5, 7, 100, 1365, 4095])
def test_a_free_memory_chunk_below_all_rows_is_a_power_of_two_and_never_larger_than_what_fits(fit_rows):
    n_rows = 4096
    rc = rows_per_chunk(n_rows, MIB, FreeMemoryBudget(fit_rows * MIB + MIB // 2))
    assert rc & (rc - 1) == 0 and rc <= fit_rows < 2 * rc
    assert rows_per_chunk(n_rows, MIB, FreeMemoryBudget(n_rows * MIB)) == n_rows  # all rows: no rounding
    assert rows_per_chunk(1365, MIB, FreeMemoryBudget(1365 * MIB)) == 1365
    assert rows_per_chunk(n_rows, MIB, fit_rows * MIB + MIB // 2) == fit_rows  # plain budget: exact


def test_channel_chunks_have_no_floor():
    """At most c chunks, whatever N: a zero remainder of a budget still runs channel by channel."""
    assert divisor_chunk(128, MIB, FreeMemoryBudget(0)) == 1
    assert divisor_chunk(128, MIB, FreeMemoryBudget(64 * MIB)) == 64


class _CudaPair:
    """The attributes of a CUDA pair shard ``budget_bytes`` reads (no GPU needed)."""

    is_cuda, device = True, "cuda:0"

    def __init__(self, n_bytes: int):
        self.n_bytes = n_bytes

    def numel(self) -> int:
        return self.n_bytes // 2

    def element_size(self) -> int:
        return 2


GIB = 1 << 30


@pytest.mark.parametrize("free_gib", [40.0, 60.0, 120.0])
def test_a_cuda_budget_away_from_the_limit_does_not_depend_on_free_memory(monkeypatch, free_gib):
    """A tenth of the device (or a quarter of the pair shard when larger) whatever is free, so a
    probe's peaks are a function of N the predict strategy can fit."""
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (int(free_gib * GIB), 140 * GIB))
    assert chunking.budget_bytes(_CudaPair(GIB)) == 14 * GIB
    assert chunking.budget_bytes(_CudaPair(80 * GIB)) == min(20 * GIB, int(0.4 * free_gib * GIB))


def test_a_cuda_budget_near_the_limit_is_a_share_of_free_memory_and_keeps_its_floor(monkeypatch):
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (10 * GIB, 140 * GIB))
    budget = chunking.budget_bytes(_CudaPair(60 * GIB))
    assert budget == 4 * GIB and isinstance(budget, FreeMemoryBudget)
    # training leaves room for the backward's pair-sized tensors first, with the same size term
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (100 * GIB, 140 * GIB))
    assert chunking.training_budget_bytes(_CudaPair(GIB)) == 14 * GIB
    # 40 % of the 20 GiB left (8 GiB), rounded down to a step of an eighth of the 14 GiB term
    assert chunking.training_budget_bytes(_CudaPair(10 * GIB)) == 7 * GIB


def test_training_budgets_take_a_handful_of_values_as_free_memory_falls(monkeypatch):
    """A step's blocks read free memory as the saved block inputs pile up: the compiled training
    path compiles once per chunk shape, so their budgets must not take a new value per block."""
    budgets = set()
    for free_mib in range(200 * 1024, 0, -700):  # the free memory of 300 blocks, each saving ~0.7 GiB
        monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device, f=free_mib: (f << 20, 140 * GIB))
        budget = chunking.training_budget_bytes(_CudaPair(GIB))
        budgets.add(budget)
        assert budget <= max(0.4 * ((free_mib << 20) - chunking.BACKWARD_PAIRS * GIB), 64 << 20)
    assert len(budgets) <= 8 + 12, sorted(budgets)  # the term's eighths, powers of two below them
    assert 14 * GIB in budgets and (64 << 20) in budgets


def test_lean_training_budgets_are_a_few_pair_shards(monkeypatch):
    """A hundredth of the device made the training ops crawl; lean training budgets are four pair
    shards (at most the size term), or the lean term if larger."""
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (100 * GIB, 140 * GIB))
    with chunking.lean_budgets():
        assert chunking.training_budget_bytes(_CudaPair(GIB)) == 4 * GIB
        assert chunking.training_budget_bytes(_CudaPair(64 * GIB)) == 16 * GIB  # the size term: a quarter
        assert chunking.training_budget_bytes(_CudaPair(GIB // 64)) == int(1.4 * GIB)  # the lean term
        assert chunking.budget_bytes(_CudaPair(GIB)) == int(1.4 * GIB)  # inference: unchanged


def test_lean_budgets_are_a_32nd_of_a_cuda_pair_shard_or_a_100th_of_the_device_and_nothing_new_on_a_cpu(monkeypatch):
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (100 * GIB, 140 * GIB))
    cpu_pair = torch.zeros(64, 64, 32)
    normal = chunking.budget_bytes(cpu_pair)
    with chunking.lean_budgets():
        assert chunking.budget_bytes(_CudaPair(64 * GIB)) == 2 * GIB
        assert not isinstance(chunking.budget_bytes(_CudaPair(64 * GIB)), FreeMemoryBudget)
        assert chunking.budget_bytes(_CudaPair(GIB)) == int(1.4 * GIB)
        assert chunking.budget_bytes(cpu_pair) == normal
        with chunking.override_budget(7):
            assert chunking.budget_bytes(_CudaPair(32 * GIB)) == 7
    assert chunking.budget_bytes(_CudaPair(32 * GIB)) == 14 * GIB


@pytest.mark.parametrize("c, ck_budget, ck_scratch_max", [(128, 2, 128), (128, 1, 128), (128, 16, 128),
                                                           (128, 128, 128), (128, 2, 8), (128, 2, 0), (8, 1, 8),
                                                           (7, 1, 7), (3, 1, 3), (1, 1, 1)])
def test_scratch_channel_chunks_cover_every_channel_once_and_keep_operands_in_unfilled_channels(
        c, ck_budget, ck_scratch_max):
    chunks = chunking.scratch_channel_chunks(c, ck_budget, ck_scratch_max)
    assert [ch for cs, _ in chunks for ch in range(cs.start, cs.stop)] == list(range(c))
    for cs, in_scratch in chunks:
        k = cs.stop - cs.start
        if in_scratch:  # output, left and right all inside the unfilled channels; a power of two
            assert cs.stop + 2 * k <= c and k & (k - 1) == 0
            assert ck_budget < k <= ck_scratch_max
        else:
            assert k <= ck_budget
    # never more chunks than the budget's own chunks, and far fewer when the budget is small
    assert len(chunks) <= -(-c // ck_budget)
    if (c, ck_budget, ck_scratch_max) == (128, 2, 128):
        assert len(chunks) == 12  # against 64 chunks of 2


def test_scratch_chunks_shrink_to_clear_the_floor_of_a_free_memory_budget():
    """A chunk's operand rows must clear ``rows_per_chunk``'s floor under a free-memory budget, so
    near the limit the scratch chunks are only as large as that allows (a plain int: any)."""
    from cpbench.models.pairformer.layers.trimul import TriangleMultiplication
    from cpbench.models.pairformer.parallel.layout import serial_layout

    op, n_local, n_pad, c_z, es = TriangleMultiplication(128), 4096, 4096, 128, 2
    row_b = op._operand_row_bytes(n_pad, c_z, 8, es)
    tight = FreeMemoryBudget(row_b * MIN_ROWS_PER_CHUNK)  # room for 8 channels' rows, not 16
    assert op._scratch_max(n_local, n_pad, c_z, es, tight, serial_layout()) == 8
    assert chunking.clears_floor(n_local, op._operand_row_bytes(n_pad, c_z, 8, es), tight)
    assert not chunking.clears_floor(n_local, op._operand_row_bytes(n_pad, c_z, 16, es), tight)
    assert op._scratch_max(n_local, n_pad, c_z, es, int(tight), serial_layout()) == 128
    assert op._scratch_max(n_local, n_pad, c_z, es, FreeMemoryBudget(1), serial_layout()) == 0


@pytest.mark.parametrize("free_gib, pair_gib", [(135.0, 0.03), (120.0, 1.0), (100.0, 4.0), (90.0, 6.0)])
def test_an_ample_block_budget_is_what_every_op_of_the_block_would_read(monkeypatch, free_gib, pair_gib):
    """Away from the limit a block reads its budget once (``block.agreed_chunks``): it must be the
    budget each op would read with up to four pair shards and two budgets held besides z."""
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (int(free_gib * GIB), 140 * GIB))
    pair = _CudaPair(int(pair_gib * GIB))
    ample = chunking.ample_budget(pair)
    assert ample == 14 * GIB and isinstance(ample, FreeMemoryBudget)
    held_b = 4 * int(pair_gib * GIB) + 2 * ample
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (int(free_gib * GIB) - held_b, 140 * GIB))
    for tensor_gib in (pair_gib / 8, pair_gib, 4 * pair_gib):
        assert chunking.budget_bytes(_CudaPair(int(tensor_gib * GIB))) == ample


@pytest.mark.parametrize("free_gib, pair_gib", [(60.0, 1.0), (100.0, 10.0), (139.0, 60.0)])
def test_near_the_limit_a_block_has_no_ample_budget(monkeypatch, free_gib, pair_gib):
    """Where what an op leaves free (or the pair's quarter) sets its budget, each op reads its own."""
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (int(free_gib * GIB), 140 * GIB))
    assert chunking.ample_budget(_CudaPair(int(pair_gib * GIB))) == 0


def test_lean_overridden_and_cpu_budgets_have_no_ample_block_budget(monkeypatch):
    monkeypatch.setattr(chunking, "_cuda_free_bytes", lambda device: (135 * GIB, 140 * GIB))
    with chunking.lean_budgets():
        assert chunking.ample_budget(_CudaPair(GIB)) == 0
    with chunking.override_budget(1 << 20):
        assert chunking.ample_budget(_CudaPair(GIB)) == 0
    assert chunking.ample_budget(torch.zeros(8, 8, 4)) == 0
    assert chunking.budgets_from_shapes(torch.zeros(8, 8, 4)) and not chunking.budgets_from_shapes(_CudaPair(GIB))


@pytest.mark.parametrize("budget_b", [None, 24 * 24 * 16 * 4 // 3])  # whole ops; chunks of a few rows
def test_the_in_place_lean_paths_match_the_eager_adds_and_copies_used_near_the_limit(monkeypatch, budget_b):
    """Away from the limit the lean ops add and store through the fused passes (``residual``,
    ``out``); near it (``chunking.near_limit``) they keep the eager ``+=`` and copies. The same
    ops in another order of writes: one block, serial, fresh random input, equal to the bit."""
    from cpbench.models.pairformer.modules.block import PairformerBlock
    from cpbench.models.pairformer.parallel.layout import serial_layout

    torch.seed()  # fresh random weights and inputs
    block = PairformerBlock(c_s=32, c_z=16, heads_single=4, heads_tri=2, head_dim_tri=8, transition_factor=2)
    s0, z0 = torch.randn(24, 32), torch.randn(24, 24, 16)
    mask = torch.ones(24, dtype=torch.bool)
    mask[-5:] = False
    outs = {}
    for near in (False, True):
        monkeypatch.setattr(chunking, "near_limit", lambda pair, near=near: near)
        with torch.no_grad(), chunking.override_budget(budget_b):
            outs[near] = block(s0.clone(), z0.clone(), mask, serial_layout())
    assert torch.equal(outs[False][0], outs[True][0]) and torch.equal(outs[False][1], outs[True][1])
    assert not torch.equal(outs[False][1], z0)  # the block did update z
