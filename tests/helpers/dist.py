"""Run a function on P gloo processes (CPU) and collect what each rank returns.

    results = run_distributed(fn, world_size=2, args=(...,))   # [rank0_result, rank1_result]

``fn(rank, world_size, *args)`` must be importable (module level) and return something
picklable. Each worker uses one intra-op thread (CI machines have 2 cores shared by every
test), joins a fresh TCP rendezvous on a free port, and its exception (with traceback) is
re-raised in the caller. Workers still running at ``timeout_s`` are killed.

Workers are forked from a forkserver that imported torch once (``set_forkserver_preload``):
a clean single-threaded parent, as with spawn, without paying torch's import (~2.5 s of CPU)
per rank. The forkserver starts at the first call and keeps that call's environment.
"""

from __future__ import annotations

import queue as queue_mod
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cpbench.harness.slots import free_port


def _worker(fn: Callable, rank: int, world_size: int, port: int, results: Any, args: tuple) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        results.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 - report every failure to the parent, which raises it
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable, world_size: int, args: tuple = (), timeout_s: float = 180,
                    preload: tuple[str, ...] = ()) -> list[Any]:
    """``[fn(rank, world_size, *args) for rank in range(world_size)]``, each in its own process.
    ``preload``: more modules for the forkserver to import once (only when this call starts it)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "cpbench.models.pairformer", *preload])
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, results, args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, value = results.get(timeout=timeout_s)
            if status == "error":
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
            out[rank] = value
    except queue_mod.Empty:
        raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(out))} gave no result within {timeout_s} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world_size)]
