"""Rank slots and the supervisors' group: which ranks this process supervises, and how the
supervisors of one job talk.

``discover_slots`` turns the environment into rank slots: local (one supervisor owns all
``cp`` ranks), torchrun (``RANK``/``WORLD_SIZE``/... : one rank per supervisor) or SLURM
(submitit's job environment: one rank per task). With several supervisors they form a gloo
group (``SupervisorGroup``) that no GPU failure can poison: supervisor 0 picks each point's
worker port and broadcasts it, and the runner agrees on every verdict over it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from cpbench.harness.devices import local_gpu_count


@dataclass(frozen=True)
class Slots:
    """The rank slots this supervisor owns.

    Attributes:
        mode: "local" | "torchrun" | "slurm".
        world_size: ranks of the point in total (must equal cp).
        supervisor_rank: this supervisor's index (0 writes files).
        num_supervisors: supervisors of the job.
        ranks: global worker ranks this supervisor starts.
        device_indices: local CUDA device of each of ``ranks`` (0 on CPU).
        master_addr: host of supervisor 0 (the workers' rendezvous host too).
        master_port: the supervisors' group port (unused locally).
    """

    mode: str
    world_size: int
    supervisor_rank: int
    num_supervisors: int
    ranks: tuple[int, ...]
    device_indices: tuple[int, ...]
    master_addr: str = "127.0.0.1"
    master_port: int | None = None


def discover_slots(cp: int, device: str) -> Slots:
    """Rank slots from the environment: SLURM (submitit) > torchrun > local.

    Under SLURM and torchrun each supervisor runs one rank; its GPU is ``LOCAL_RANK`` when it
    sees several, else device 0 (SLURM may have bound one GPU per task already: never force
    another ``CUDA_VISIBLE_DEVICES``).
    """
    env = os.environ
    dist_env = None
    if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        try:
            from submitit.helpers import TorchDistributedEnvironment

            dist_env = TorchDistributedEnvironment()
        except Exception:  # noqa: BLE001 - not a submitit job (e.g. a bare srun): use torchrun vars
            dist_env = None
    if dist_env is not None:
        mode, rank, world = "slurm", dist_env.rank, dist_env.world_size
        local_rank, addr, port = dist_env.local_rank, dist_env.master_addr, dist_env.master_port
    elif int(env.get("WORLD_SIZE", "1")) > 1 and "RANK" in env and "MASTER_ADDR" in env:
        mode, rank, world = "torchrun", int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank, addr, port = int(env.get("LOCAL_RANK", "0")), env["MASTER_ADDR"], int(env["MASTER_PORT"])
    else:
        return Slots("local", cp, 0, 1, tuple(range(cp)), tuple(range(cp)) if device == "cuda" else (0,) * cp)
    gpu = (local_rank if local_gpu_count() > 1 else 0) if device == "cuda" else 0
    return Slots(mode, world, rank, world, (rank,), (gpu,), addr, port)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SupervisorGroup:
    """The supervisors' CPU (gloo) group; a no-op with a single supervisor."""

    def __init__(self, slots: Slots, timeout_s: float = 3600.0):
        self.slots = slots
        self.size = slots.num_supervisors
        if self.size > 1:
            import datetime as dt

            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"tcp://{slots.master_addr}:{slots.master_port}",
                                    rank=slots.supervisor_rank, world_size=self.size,
                                    timeout=dt.timedelta(seconds=timeout_s))

    def worker_port(self) -> int:
        """A fresh rendezvous port for one point's workers, picked by supervisor 0."""
        port = free_port() if self.slots.supervisor_rank == 0 else 0
        if self.size == 1:
            return port
        import torch.distributed as dist

        box = [port]
        dist.broadcast_object_list(box, src=0)
        return int(box[0])

    def any_all(self, flags: list[int]) -> list[int]:
        """Element-wise max of ``flags`` over supervisors (one all-reduce)."""
        if self.size == 1:
            return flags
        import torch
        import torch.distributed as dist

        t = torch.tensor(flags, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def broadcast(self, obj):
        """Supervisor 0's ``obj`` on every supervisor."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: list) -> list:
        """Concatenation of every supervisor's list (ordered by supervisor)."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        out: list = [None] * self.size
        dist.all_gather_object(out, obj)
        return [x for part in out for x in part]

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
