"""The trunk's blocks replayed as a CUDA graph (``model.cuda_graphs=true``) against the same blocks
run eagerly, on one GPU.

    python scripts/graph_parity.py --n 256 512 --blocks 4 --dtypes bf16 fp32 --kernels flex torch \
        --out graph_parity.json

Per backend, dtype and N, two cases:

* ``blocks``: the boltz2 trunk (trunk only, ``--blocks`` blocks, weights from seed 0) runs two
  batches (fresh random features) eagerly, the first one twice (the eager run-to-run difference:
  the tolerance, 0 where the kernels are deterministic), then with graphs, three passes per
  forward (recycles=2: the first pass of a shape eager, the second captured and replayed, the
  third replayed) on the same two batches (the second only replays: its features go into the
  graph's static inputs);
* ``denoiser``: the same trunk with the diffusion sampler (``--steps`` steps x 2 samples): the
  sampled coordinates eagerly, twice (the tolerance), then with the denoiser's calls replayed
  from the second on.

A line is ok when the graph did replay and the replay differs from the eager output by at most
twice what two eager runs of the same input differ by (``TOLERANCE_FACTOR``: the eager kernels
are not deterministic, atomics in index_add and split reductions, so one eager pair is a single
sample of that noise; in bf16 both are one or two units in the last place of the largest
outputs). Prints one JSON line per case and writes
``{"gpu", "torch", "results": [...]}`` to ``--out``. Not a cpbench point: a check of the path
before it is timed (run it on the GPU before a timing campaign of ``model.cuda_graphs``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from one_gpu import one_rank_mesh, trunk_setup

from cpbench.models.pairformer.modules.cuda_graphs import GraphedBlocks, GraphedDenoiser
from cpbench.models.pairformer.modules.sampler import sample

TOLERANCE_FACTOR = 2.0


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
    run_to_run = max_abs(eager_a, eager_a2)
    tol = {k: TOLERANCE_FACTOR * v for k, v in run_to_run.items()}
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
            "eager_run_to_run": run_to_run, "tolerance": tol, "ok": ok}


def sampled(model, batch, graphs, seed: int, steps: int) -> torch.Tensor:
    """The sampler's coordinates ``[2, A, 3]`` after an eager trunk pass (``prepare`` overwrites
    the pair, so every run recomputes it)."""
    with torch.no_grad():
        s, z = model(batch, model.layout, recycles=0)
        ctx = model.diffusion.prepare(s, z, model.s_inputs, batch, model.layout)
        return sample(model.diffusion, ctx, steps, 2, seed, graphs=graphs).clone()


def denoiser_case(n: int, blocks: int, kernels: str, dtype: str, mesh, device: torch.device, steps: int) -> dict:
    workflow = dict(msa_blocks=0, recycles=0, sampling=True, sampling_steps=steps, samples=2)
    _, model, batch = trunk_setup(n, blocks, kernels, mesh, device, dtype=dtype, workflow=workflow)
    seed = int(time.time_ns()) % 2**31
    eager, eager2 = sampled(model, batch, None, seed, steps), sampled(model, batch, None, seed, steps)
    run_to_run = float((eager - eager2).abs().max())
    tol = TOLERANCE_FACTOR * run_to_run
    graphs = GraphedDenoiser()
    graphed = sampled(model, batch, graphs, seed, steps)
    diff = float((graphed - eager).abs().max())
    return {"what": "graphed denoiser vs eager", "kernels": kernels, "dtype": dtype, "N": n, "blocks": blocks,
            "steps": steps, "state": graphs.state, "capture_s": round(graphs.capture_s, 3), "peak_b": graphs.peak_b,
            "max_abs": diff, "eager_run_to_run": run_to_run, "tolerance": tol,
            "ok": graphs.state == "replay" and diff <= tol}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    parser.add_argument("--kernels", nargs="+", default=["flex", "torch"])
    parser.add_argument("--steps", type=int, default=6, help="sampler steps of the denoiser case")
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
                    for what, case in (("graphed blocks vs eager", lambda: one_case(
                                           n, args.blocks, kernels, dtype, mesh, device)),
                                       ("graphed denoiser vs eager", lambda: denoiser_case(
                                           n, args.blocks, kernels, dtype, mesh, device, args.steps))):
                        try:
                            line = case()
                        except Exception as exc:  # noqa: BLE001 -- one case's failure is a result line
                            line = {"what": what, "kernels": kernels, "dtype": dtype, "N": n,
                                    "error": f"{type(exc).__name__}: {str(exc)[:3000]}",
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
