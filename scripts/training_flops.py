"""How many forwards' worth of FLOPs one training step of the reference trunk does, counted on a
CPU with ``torch.utils.flop_counter.FlopCounterMode`` (no timing): the boltz2 trunk (trunk only)
with ``--blocks`` blocks at ``--n`` tokens, fp32, ``kernels=torch``, cp=1 (gloo), in units of
its forward with autograd on (the inference forward is not the unit: on a CPU its attention runs
a fused kernel the counter does not count, while with autograd it runs as counted matmuls); with
and without ``workflow.checkpointing``, at the default chunk budget and at a 1 MiB one
(checkpointed row chunks).

    python scripts/training_flops.py --n 128 --blocks 2

A diagnosis, not a cpbench point (docs/perf_notes.md, "Twelfth session").
"""

from __future__ import annotations

import argparse

import torch
from one_gpu import TRUNK_ONLY, one_rank_mesh
from torch.utils.flop_counter import FlopCounterMode

from cpbench.models.pairformer.adapter import PairformerAdapter
from cpbench.models.pairformer.parallel import chunking


def _setup(mesh, n: int, blocks: int, checkpointing: bool):
    device = torch.device("cpu")
    adapter = PairformerAdapter(**TRUNK_ONLY, blocks=blocks, dtype="fp32", kernels="torch",
                                checkpointing=checkpointing)
    torch.manual_seed(0)
    model = adapter.build_model(mesh, device)
    return adapter, model, adapter.build_batch(n, 8 * n, 256, mesh, device)


def forward_flops(mesh, n: int, blocks: int) -> int:
    """FLOPs of the trunk's forward with autograd on, without checkpointing."""
    _, model, batch = _setup(mesh, n, blocks, False)
    with FlopCounterMode(display=False) as counter:
        model(batch, model.layout, recycles=0, run_blocks=None, checkpointing=False)
    return counter.get_total_flops()


def step_flops(mesh, n: int, blocks: int, checkpointing: bool, budget_b: int | None) -> int:
    """FLOPs of one training step (forward, backward, AdamW)."""
    adapter, model, batch = _setup(mesh, n, blocks, checkpointing)
    with chunking.override_budget(budget_b), FlopCounterMode(display=False) as counter:
        adapter.run_step(model, batch, train=True)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--port", type=int, default=29555)
    args = parser.parse_args()
    mesh = one_rank_mesh(torch.device("cpu"), args.port)
    forward = forward_flops(mesh, args.n, args.blocks)
    print(f"N={args.n} blocks={args.blocks}: forward (autograd on) {forward / 1e9:.2f} GFLOP")
    for checkpointing in (False, True):
        for budget_b in (None, 1 << 20):
            total = step_flops(mesh, args.n, args.blocks, checkpointing, budget_b)
            print(f"  training checkpointing={checkpointing} budget={'default' if budget_b is None else '1 MiB'}: "
                  f"{total / 1e9:.2f} GFLOP = {total / forward:.2f}x the forward")


if __name__ == "__main__":
    main()
