"""Adapters whose rank 1 alone fails above a threshold N while rank 0 waits in a collective.

``model=adapter model._target_=tests.helpers.faults.FaultAdapter +model.fault=oom
+model.threshold_n=48``: at N > threshold_n, rank 1 raises ``torch.cuda.OutOfMemoryError``
(``oom``), sleeps for ever (``hang``), exits with code 3 without a word (``exit``) or dies of a
segmentation fault (``segfault``: a native crash, as a library can under the CPU cap), raises
an ordinary exception from a helper (``raise``: a missing module of a user's model), or
completes its step with a NaN loss (``nan_loss``: a kernel that went wrong, the all-reduce carries
the NaN to every rank), while
rank 0 has entered the step's all-reduce; ``hang_later`` completes two steps, then hangs like
``hang`` (a point too slow for its timeout). At N <= threshold_n every rank completes.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn

FAULTS = ("oom", "hang", "hang_later", "exit", "segfault", "raise", "nan_loss", "none")


class FaultAdapter:
    """A few Linear layers over ``[N/cp, width]`` tokens and one all-reduce per step."""

    def __init__(self, fault: str = "oom", threshold_n: int = 48, width: int = 8, **_: object):
        assert fault in FAULTS, fault
        self.fault, self.threshold_n, self.width = fault, threshold_n, width
        self.steps = 0

    def build_model(self, mesh, device: torch.device) -> nn.Module:
        return nn.Sequential(nn.Linear(self.width, self.width), nn.ReLU(), nn.Linear(self.width, 1)).to(device)

    def build_batch(self, N: int, n_atoms: int, S: int, mesh, device: torch.device) -> dict:
        rows = -(-N // mesh.size())
        return {"N": N, "x": torch.randn(N, self.width, device=device)[:rows]}

    def run_step(self, model: nn.Module, batch: dict, train: bool) -> torch.Tensor:
        self.steps += 1
        failing = dist.get_rank() == 1 and batch["N"] > self.threshold_n
        if failing and self.fault != "nan_loss" and (self.fault != "hang_later" or self.steps > 2):
            self._fail()
        with torch.set_grad_enabled(train):
            loss = model(batch["x"]).sum()
        if failing and self.fault == "nan_loss":
            loss = loss * float("nan")
        total = loss.detach().clone()
        dist.all_reduce(total)  # rank 0 waits here for a rank 1 that never comes
        return total

    def _fail(self) -> None:
        if self.fault == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (test adapter)")
        if self.fault in ("hang", "hang_later"):
            while True:
                time.sleep(60)
        if self.fault == "exit":
            os._exit(3)
        if self.fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.fault == "raise":
            _import_a_missing_module()


def _import_a_missing_module() -> None:
    raise ModuleNotFoundError("No module named 'cpbench_test_missing' (test adapter)")


class GrowingAdapter:
    """Memory that grows as N²: a ``[N/cp, N, channels]`` float32 tensor per rank per step.

    Under a CPU ``memory.limit_gib`` cap the step meets a real allocation failure above
    some N. ``run_blocks`` repeats the step body (the peak does not depend on it).
    """

    def __init__(self, channels: int = 64, error_above_n: int | None = None, **_: object):
        self.channels, self.error_above_n = channels, error_above_n

    def build_model(self, mesh, device: torch.device) -> nn.Module:
        return nn.Linear(self.channels, self.channels).to(device)

    def build_batch(self, N: int, n_atoms: int, S: int, mesh, device: torch.device) -> dict:
        return {"N": N, "rows": -(-N // mesh.size())}

    def run_step(self, model: nn.Module, batch: dict, train: bool, run_blocks: int | None = None) -> torch.Tensor:
        if self.error_above_n is not None and batch["N"] > self.error_above_n:
            raise ValueError(f"test adapter refuses N={batch['N']}")
        with torch.no_grad():
            for _ in range(run_blocks or 2):
                z = torch.ones(batch["rows"], batch["N"], self.channels, device=model.weight.device)
                out = z.sum()
                del z
        dist.all_reduce(out)
        return out
