"""``python -m cpbench.link --out FILE``: measure this node's interconnect for ``link=measured``.

    python -m cpbench.link --out link_h200x8.json              # every local GPU
    python -m cpbench.link --out link.json --gpus 2 --max-mib 256
    python -m cpbench routine=timing emulate=true cp=8 link=measured link.file=link_h200x8.json

One process per GPU (NCCL). For each collective kind (all-to-all, all-gather, reduce-scatter,
all-reduce, p2p: rank r sends to r+1 and receives from r-1, as a ring step) and each size per
call from 64 KiB to ``--max-mib`` MiB (powers of 4), it times ``--iters`` calls after a warmup
with CUDA events and keeps the median; bus bandwidth is nccl-tests' (bytes each rank sends / time:
``cpbench.link.model``). The latency is the median time of an 8-byte all-reduce. It also
records the device memory NCCL holds outside PyTorch's allocator once every kind has run
(``torch.cuda.mem_get_info`` before the process group and after, less what PyTorch reserved):
``emulate.comm_reserve_gib=auto`` uses it when ``link=measured``. Needs two or more GPUs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import sys
from pathlib import Path

from cpbench.link.model import KINDS

MIN_BYTES = 64 << 10


def _sizes(max_mib: int) -> list[int]:
    sizes, size = [], MIN_BYTES
    while size <= max_mib << 20:
        sizes.append(size)
        size *= 4
    return sizes


def _sent_bytes(kind: str, per_rank_b: int, world: int) -> float:
    """Bytes one rank sends for a call of ``per_rank_b`` bytes per rank (``comm.py``'s counting)."""
    return {"all_gather": (world - 1) * per_rank_b, "reduce_scatter": (world - 1) / world * per_rank_b,
            "all_reduce": 2 * (world - 1) / world * per_rank_b, "all_to_all": (world - 1) / world * per_rank_b,
            "p2p": per_rank_b}[kind]


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    free_before_b, _ = torch.cuda.mem_get_info()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))

    def timed(fn) -> float:
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier(device_ids=[rank])
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)  # ms

    table: dict[str, dict[int, float]] = {k: {} for k in KINDS}
    for size in _sizes(args.max_mib):
        n = size // 2  # bf16 elements per rank
        x = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        big = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
        recv = torch.empty_like(x)
        calls = {
            "all_gather": lambda: dist.all_gather_into_tensor(big, x),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(x, big),
            "all_reduce": lambda: dist.all_reduce(x),
            "all_to_all": lambda: dist.all_to_all_single(recv, x),
            "p2p": lambda: [r.wait() for r in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)])],
        }
        for kind, fn in calls.items():
            ms = timed(fn)
            table[kind][size] = _sent_bytes(kind, size, world) / (ms * 1e-3) / 1e9
    tiny = torch.ones(2, dtype=torch.float32, device="cuda")
    latency_us = timed(lambda: dist.all_reduce(tiny)) * 1e3
    torch.cuda.synchronize()
    free_after_b, _ = torch.cuda.mem_get_info()
    comm_b = (free_before_b - free_after_b) - torch.cuda.memory_reserved()
    gathered = [None] * world
    dist.all_gather_object(gathered, {"table": table, "latency_us": latency_us, "comm_b": comm_b})
    if rank == 0:
        queue.put(gathered)
    dist.destroy_process_group()


def calibrate(args: argparse.Namespace) -> dict:
    """The calibration record (slowest rank per entry); see the module docstring."""
    import torch
    import torch.multiprocessing as mp

    world = args.gpus or torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, port, args, queue), nprocs=world, join=True, start_method="spawn")
    per_rank = queue.get()
    busbw = {k: {str(size): round(min(r["table"][k][size] for r in per_rank), 2) for size in per_rank[0]["table"][k]}
             for k in KINDS}
    name = torch.cuda.get_device_name(0)
    return {
        "name": "measured",
        "source": (f"python -m cpbench.link on {socket.gethostname()}: {world} x {name}, NCCL "
                   f"{'.'.join(map(str, torch.cuda.nccl.version()))}, torch {torch.__version__}, "
                   f"{dt.date.today().isoformat()}"),
        "latency_us": round(max(r["latency_us"] for r in per_rank), 2),
        "busbw_gbps": busbw,
        "comm_memory_gib": round(max(r["comm_b"] for r in per_rank) / (1 << 30), 3),
        "gpus": world, "gpu": name, "iters": args.iters,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpbench.link", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the calibration file to write (JSON)")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: every local GPU)")
    parser.add_argument("--max-mib", type=int, default=1024, help="largest size per call, MiB (default 1024)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2 or (args.gpus is not None and not 2 <= args.gpus <= gpus):
        print(f"cpbench.link: error: --gpus={args.gpus if args.gpus is not None else gpus}: needs 2 to {max(gpus, 2)} "
              f"GPUs, {gpus} visible here", file=sys.stderr)
        return 2
    record = calibrate(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"cpbench.link: {record['source']}; latency {record['latency_us']} us; "
          + "; ".join(f"{k} {max(v.values()):.0f} GB/s" for k, v in record["busbw_gbps"].items())
          + f"; NCCL device memory {record['comm_memory_gib']} GiB -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
