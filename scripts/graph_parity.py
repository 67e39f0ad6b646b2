"""The trunk's blocks replayed as a CUDA graph (``model.cuda_graphs=true``) against the same blocks
run eagerly, on one GPU.

    python scripts/graph_parity.py --n 256 512 --blocks 4 --dtypes bf16 fp32 --kernels flex torch \
        --out graph_parity.json

Per backend, dtype and N: the boltz2 trunk (trunk only, ``--blocks`` blocks, weights from seed 0)
runs two batches (fresh random features) eagerly, the first one twice (the eager run-to-run
difference: the tolerance, 0 where the kernels are deterministic), then with graphs, three passes
per forward (recycles=2: the first pass of a shape eager, the second captured and replayed, the
third replayed) on the same two batches (the second only replays: its features go into the
graph's static inputs). A line is ok when the replay differs from the eager output by no more
than two eager runs differ, and the blocks did replay. Prints one JSON line per case and writes
``{"gpu", "torch", "results": [...]}`` to ``--out``. Not a cpbench point: a check of the path
before it is timed (``scripts/campaign8_h200.sh graphs``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from one_gpu import one_rank_mesh, trunk_setup

from cpbench.models.pairformer.modules.cuda_graphs import GraphedBlocks


def forward(model, batch, recycles: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        s, z = model(batch, model.layout, recycles=recycles)
    return s.float().clone(), z.float().clone()


def max_abs(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> dict:
    return {"s": float((a[0] - b[0]).abs().max()), "z": float((a[1] - b[1]).abs().max())}


def one_case(n: int, blocks: int, kernels: str, dtype: str, mesh, device: torch.device) -> dict:
    adapter, model, batch_a = trunk_setup(n, blocks, kernels, mesh, device, dtype=dtype)
    torch.manual_seed(int(time.time_ns()) % 2**31)  # the second batch: fresh features
    batch_b = adapter.build_batch(n, 8 * n, 256, mesh, device)
    model.graphs = None
    eager_a, eager_b, eager_a2 = forward(model, batch_a), forward(model, batch_b), forward(model, batch_a)
    tol = max_abs(eager_a, eager_a2)
    model.graphs = graphs = GraphedBlocks()
    start_s = time.perf_counter()
    graphed_a = forward(model, batch_a)
    first_s = time.perf_counter() - start_s
    state_a = graphs.state
    graphed_b = forward(model, batch_b)
    diff_a, diff_b = max_abs(graphed_a, eager_a), max_abs(graphed_b, eager_b)
    ok = (state_a == graphs.state == "replay"
          and all(diff[k] <= tol[k] for diff in (diff_a, diff_b) for k in ("s", "z")))
    return {"what": "graphed blocks vs eager", "kernels": kernels, "dtype": dtype, "N": n, "blocks": blocks,
            "state": graphs.state, "capture_s": round(graphs.capture_s, 3), "first_forward_s": round(first_s, 3),
            "peak_b": graphs.peak_b, "max_abs_same_batch": diff_a, "max_abs_new_batch": diff_b,
            "eager_run_to_run": tol, "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    parser.add_argument("--kernels", nargs="+", default=["flex", "torch"])
    parser.add_argument("--out", default="graph_parity.json")
    parser.add_argument("--port", type=int, default=29521)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("graph_parity.py: needs a CUDA GPU (CUDA graphs); the CPU tests cover the "
                         "plumbing (tests/unit/test_cuda_graphs.py)")
    device = torch.device("cuda", 0)
    mesh = one_rank_mesh(device, args.port)
    results = []
    try:
        for kernels in args.kernels:
            for dtype in args.dtypes:
                for n in args.n:
                    try:
                        line = one_case(n, args.blocks, kernels, dtype, mesh, device)
                    except Exception as exc:  # noqa: BLE001 -- one case's failure is a result line
                        line = {"what": "graphed blocks vs eager", "kernels": kernels, "dtype": dtype, "N": n,
                                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                "ok": False}
                    print(json.dumps(line), flush=True)
                    results.append(line)
                    torch.cuda.empty_cache()
    finally:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "results": results},
                      f, indent=1)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
