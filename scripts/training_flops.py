"""How many forwards' worth of FLOPs one training step of the reference trunk does, counted on a
CPU with ``torch.utils.flop_counter.FlopCounterMode`` (no timing): the boltz2 trunk (trunk only)
with ``--blocks`` blocks at ``--n`` tokens, fp32, ``kernels=torch``, cp=1 (gloo), against the
inference forward; with and without ``workflow.checkpointing``, at the default chunk budget and
at a 1 MiB one (checkpointed row chunks).

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


def step_flops(mesh, n: int, blocks: int, train: bool, checkpointing: bool, budget_b: int | None) -> int:
    """FLOPs of one step (inference forward, or training forward + backward + AdamW)."""
    device = torch.device("cpu")
    adapter = PairformerAdapter(**TRUNK_ONLY, blocks=blocks, dtype="fp32", kernels="torch",
                                checkpointing=checkpointing)
    torch.manual_seed(0)
    model = adapter.build_model(mesh, device)
    batch = adapter.build_batch(n, 8 * n, 256, mesh, device)
    with chunking.override_budget(budget_b), FlopCounterMode(display=False) as counter:
        adapter.run_step(model, batch, train=train)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--port", type=int, default=29555)
    args = parser.parse_args()
    mesh = one_rank_mesh(torch.device("cpu"), args.port)
    forward = step_flops(mesh, args.n, args.blocks, False, False, None)
    print(f"N={args.n} blocks={args.blocks}: inference forward {forward / 1e9:.2f} GFLOP")
    for checkpointing in (False, True):
        for budget_b in (None, 1 << 20):
            total = step_flops(mesh, args.n, args.blocks, True, checkpointing, budget_b)
            print(f"  training checkpointing={checkpointing} budget={'default' if budget_b is None else '1 MiB'}: "
                  f"{total / 1e9:.2f} GFLOP = {total / forward:.2f}x the forward")


if __name__ == "__main__":
    main()
