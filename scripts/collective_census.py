"""Count what one inference Pairformer block does per rank under 1d CP: its collectives (by kind
and caller), its chunk agreements (``comm.agree_min``, each an all-reduce and a host sync unless
the block agreed its budget once) and its chunk-budget readings (``chunking.budget_bytes``, each a
free-memory reading on CUDA). CPU, gloo; counts, not times (docs/perf_notes.md, "Tenth session").

    python scripts/collective_census.py --n 512 --cp 2 --budget-gib 40

``--budget-gib`` stands for the budget a GPU would give each op (40 GiB: every op in one chunk,
as on an H200 at small N); a small one shows the chunk loops' collectives.
"""

from __future__ import annotations

import argparse
import collections
import json
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cpbench.harness.slots import free_port
from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import layout_1d

COLLECTIVES = ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter_tensor", "reduce_scatter_single", "send", "recv", "isend", "irecv")
BOLTZ2 = dict(c_s=384, c_z=128, heads_single=16, heads_tri=4, head_dim_tri=32, transition_factor=4)


def _counting(counts: collections.Counter, key: str, fn):
    def wrapped(*args, **kwargs):
        caller = traceback.extract_stack(limit=3)[0]
        counts[f"{key} <- {caller.name}"] += 1
        return fn(*args, **kwargs)
    return wrapped


def _rank(rank: int, world: int, port: int, n: int, budget_gib: float, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    counts: collections.Counter = collections.Counter()
    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _counting(counts, name, getattr(dist, name)))
    comm._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    real_agree, real_budget = comm.agree_min, chunking.budget_bytes
    agreements, readings = [0], [0]

    def agree_min(*args, **kwargs):
        agreements[0] += 1
        return real_agree(*args, **kwargs)

    def budget_bytes(*args, **kwargs):
        readings[0] += 1
        return real_budget(*args, **kwargs)

    comm.agree_min, chunking.budget_bytes = agree_min, budget_bytes
    torch.manual_seed(0)
    block = PairformerBlock(**BOLTZ2)
    layout = layout_1d()
    s, z = torch.randn(n // world, BOLTZ2["c_s"]), torch.randn(n // world, n, BOLTZ2["c_z"])
    with torch.no_grad(), chunking.override_budget(int(budget_gib * (1 << 30))):
        block(s, z, torch.ones(n, dtype=torch.bool), layout)
    out.put({"rank": rank, "collectives": dict(sorted(counts.items())), "agree_min_calls": agreements[0],
             "budget_readings": readings[0]})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="tokens (a multiple of --cp)")
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=40.0)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, args.cp, port, args.n, args.budget_gib, out)) for r in range(args.cp)]
    for p in procs:
        p.start()
    results = sorted((out.get(timeout=1800) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    print(json.dumps({"n": args.n, "cp": args.cp, "budget_gib": args.budget_gib, "torch": torch.__version__,
                      "ranks": results}, indent=1))


if __name__ == "__main__":
    main()
