"""The emulation's fill clock (``emulate=true``, ``cpbench.harness.emulation``).

Under torch's fake process group no peer's data arrives, so whoever uses a collective's output
fills it (the harness the receives of ``batch_isend_irecv``, the reference trunk its all-gather and
reduce-scatter outputs, ``parallel/comm.py``), and the fake backend itself may copy (torch 2.13's
all-gather copies the input into every block, its all-to-all the send buffer whole; torch 2.11's
all-gather too).
Both stand in for what a real run's collectives write (NCCL's kernels: link time, which the
communication model counts), so they are not the rank's compute: the reference runs each
collective and its fills inside ``FILLS.timed`` (``comm.link_work``), the harness runs torch's
collectives inside it under the fake group (``emulation.clock_collectives``: an adapter's too), and
the worker takes that time out of every timed step (the record's ``emulation_fill_ms``). An
adapter that fills buffers of its own clocks them the same way. Here, not in the harness, so that
adapters (models) may use it without importing the harness.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch


class FillClock:
    """The time the emulation's fills take, between two ``take_ms`` calls: CUDA events around each
    fill on its stream (read after the caller synchronised the device), wall time on a CPU. A section
    inside another is the outer one's (counted once: the harness clocks torch's collectives under
    the fake group, and the reference's ``comm.link_work`` wraps some of them again). Inside a
    CUDA-graph capture or a compiled region nothing is recorded (no emulated run captures one:
    graphs replay at cp=1)."""

    def __init__(self) -> None:
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu_ms = 0.0
        self._depth = 0

    @contextlib.contextmanager
    def timed(self, like: torch.Tensor) -> Iterator[None]:
        """Time the fill run inside, on ``like``'s device."""
        if self._depth or torch.compiler.is_compiling():
            yield
            return
        self._depth += 1
        try:
            with self._clocked(like):
                yield
        finally:
            self._depth -= 1

    @contextlib.contextmanager
    def _clocked(self, like: torch.Tensor) -> Iterator[None]:
        if like.device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                yield
                return
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._cpu_ms += (time.perf_counter() - t0) * 1e3

    def take_ms(self) -> float:
        """The fills' time (ms) since the last call, and start again; the device must be idle."""
        ms = self._cpu_ms + sum(start.elapsed_time(end) for start, end in self._events)
        self._events.clear()
        self._cpu_ms = 0.0
        return ms


FILLS = FillClock()
