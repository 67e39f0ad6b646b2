"""The harness's collective counter (``cpbench.harness.collectives``) against the reference trunk's
own count (``parallel/comm.py``'s ``BYTES``) over the same steps: inference and a training step
(checkpointed, backward collectives included), 1d cp=2 and a 2x2 grid, gloo. Bytes agree per kind;
calls too, except p2p, where the reference counts one call per ``batch_isend_irecv`` exchange and
the counter one per send."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from cpbench.harness.collectives import CollectiveCounter
from cpbench.models.pairformer.adapter import PairformerAdapter, trunk_loss
from cpbench.models.pairformer.parallel import comm

from helpers.dist import run_distributed

TINY = dict(c_s=16, c_z=8, blocks=2, heads_single=2, heads_tri=2, head_dim_tri=4, transition_factor=2, c_atom=8,
            c_atompair=4, atom_blocks=1, atom_heads=2, c_m=8, msa_blocks=1, dtype="fp32", recycles=1)


def _worker(rank: int, world: int, shape: tuple[int, ...]) -> dict:
    names = ("cp",) if len(shape) == 1 else ("cp0", "cp1")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    adapter = PairformerAdapter(**TINY)
    torch.manual_seed(0)
    model = adapter.build_model(mesh, torch.device("cpu"))
    batch = adapter.build_batch(13, 40, 3, mesh, torch.device("cpu"))
    out = {}
    for name, train in (("inference", False), ("training", True)):
        before = comm.BYTES.snapshot()
        counter = CollectiveCounter()
        with counter:
            if train:
                s, z = model(batch, model.layout, checkpointing=True)
                trunk_loss(s, z, batch["token_mask"], model.layout).backward()
            else:
                with torch.no_grad():
                    model(batch, model.layout, recycles=1)
        out[name] = {"reference": comm.BYTES.since(before), "counted": counter.counts, "unpriced": counter.unpriced}
    return out


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=["cp2", "2x2"])
def test_the_counter_sees_what_the_trunk_counts(shape):
    results = run_distributed(_worker, int(torch.tensor(shape).prod()), (shape,))
    for rank, res in enumerate(results):
        for step, got in res.items():
            ref, counted = got["reference"], got["counted"]
            assert ref, (rank, step)  # the step communicated
            assert counted.keys() == ref.keys(), (rank, step, counted, ref)
            for kind in ref:
                assert counted[kind]["bytes"] == ref[kind]["bytes"], (rank, step, kind, counted, ref)
                if kind != "p2p":
                    assert counted[kind]["calls"] == ref[kind]["calls"], (rank, step, kind, counted, ref)
                else:
                    assert counted[kind]["calls"] >= ref[kind]["calls"], (rank, step, counted, ref)
