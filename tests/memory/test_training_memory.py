"""Training with activation checkpointing saves no activations of the MSA module's blocks for
backward, as for the Pairformer blocks: the bytes autograd saves outside checkpointed regions
(counted by an outer ``saved_tensors_hooks``) do not grow with the number of MSA blocks, while
without checkpointing they grow by each block's activations (cp=1, CPU)."""

from __future__ import annotations

import torch

from cpbench.models.pairformer.adapter import PairformerAdapter
from cpbench.models.pairformer.parallel.layout import serial_layout

N, S = 64, 16
SIZES = dict(c_s=16, c_z=16, blocks=1, heads_single=2, heads_tri=2, head_dim_tri=8, transition_factor=4,
             c_atom=8, c_atompair=4, atom_blocks=1, atom_heads=2, c_m=16)
CPU = torch.device("cpu")


def _saved_b(msa_blocks: int, checkpointing: bool) -> int:
    """Bytes autograd saves for backward during one trunk forward (fp32), outside checkpoints."""
    torch.manual_seed(0)
    adapter = PairformerAdapter(**SIZES, msa_blocks=msa_blocks, dtype="fp32", checkpointing=checkpointing)
    model = adapter.build_model(None, CPU)
    batch = adapter.build_batch(N, 2 * N, S, None, CPU)
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        s, z = model(batch, serial_layout(), checkpointing=checkpointing)
    (z.square().mean() + s.square().mean()).backward()  # the checkpointed graph still runs backward
    return saved[0]


def test_checkpointed_msa_blocks_save_no_activations():
    z_b = N * N * SIZES["c_z"] * 4
    plain = _saved_b(4, False) - _saved_b(1, False)
    ckpt = _saved_b(4, True) - _saved_b(1, True)
    assert plain > 3 * 5 * z_b, (plain, z_b)  # each uncheckpointed MSA block saves many z-sized tensors
    assert ckpt <= 3 * 2 * z_b, (ckpt, z_b)  # at most about each extra block's inputs (z, m)


def test_training_budget_leaves_room_for_the_backward(monkeypatch):
    """On CUDA the checkpointed block's budget is 40 % of what is free after BACKWARD_PAIRS
    pair-shard-sized tensors (rounded down to an eighth of the size term), at most the size term
    (a tenth of the device here: 14 GiB) (checked with the CUDA queries stubbed: no GPU here)."""
    from types import SimpleNamespace

    from cpbench.models.pairformer.parallel import chunking

    gib = 1 << 30
    pair = SimpleNamespace(is_cuda=True, device="cuda:0", numel=lambda: gib // 2, element_size=lambda: 2)  # 1 GiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * gib, 140 * gib))
    stats = {"allocated_bytes": {"all": {"current": 10 * gib}}, "reserved_bytes": {"all": {"current": 12 * gib}}}
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device: stats)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0, raising=False)
    default = chunking.budget_bytes(pair)
    training = chunking.training_budget_bytes(pair)
    assert default == int(32 * gib * 0.4)
    step = int(140 * gib * 0.1) // 8  # rounded down to an eighth of the size term (a tenth of the device)
    assert training == int((32 - chunking.BACKWARD_PAIRS) * gib * 0.4) // step * step
    assert training > int((32 - chunking.BACKWARD_PAIRS) * gib * 0.4) - step
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * gib, 140 * gib))
    assert chunking.training_budget_bytes(pair) == 64 << 20  # nothing left: the floor, not zero
    assert chunking.training_budget_bytes(torch.zeros(64, 64)) == chunking.budget_bytes(torch.zeros(64, 64))
