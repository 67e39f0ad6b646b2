"""Per-stage wall times of one step (embedding, trunk, sampling): CUDA events on GPU,
``time.perf_counter`` on CPU.

On CUDA the stages are bracketed by events, so timing a stage does not stall the stream;
``ms()`` synchronises once, at the end of the step. A stage may be entered many times (the
embedding runs once per recycle); its time is the sum. Stages may nest: the adapter times
``trunk`` around the whole trunk forward and subtracts the nested ``embedding``.

On CUDA the timer also records each stage's peak allocated memory (``peaks_gib()``): the peak
counter is reset (``torch.cuda.reset_peak_memory_stats``) at each stage start, after the peak
so far has been folded into every stage still open, so an outer stage's peak includes its
nested stages'. The reset also clears the process-wide peak the harness reads at the end of a
run; the harness takes the max of it and these stage peaks (``stage_peak_gib``), which cover
the step. On CPU no stage peak is recorded (the only cheap CPU peak, VmHWM, is process-wide and
the harness's own).

Usage::

    timer = StageTimer(device)
    with timer.stage("trunk"):
        ...
    timer.ms()  # {"trunk": 12.3}
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator

import torch


class StageTimer:
    """Accumulates the time spent inside ``stage(name)`` blocks, per name."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._spans: dict[str, list] = defaultdict(list)
        self._peaks: dict[str, int] = {}
        self._open: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._cuda:
            self._fold_peak()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._open.append(name)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._spans[name].append((start, end))
                self._fold_peak()
                self._open.remove(name)
        else:
            start_s = time.perf_counter()
            try:
                yield
            finally:
                self._spans[name].append(time.perf_counter() - start_s)

    def _fold_peak(self) -> None:
        """Fold the peak allocated since the last reset into every open stage."""
        if not self._open:
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        for open_name in self._open:
            self._peaks[open_name] = max(self._peaks.get(open_name, 0), peak)

    def note_peak(self, peak_b: int) -> None:
        """Fold a peak the allocator's counter does not see into every open stage: a CUDA graph
        replay allocates nothing, and holds its capture's peak (``cuda_graphs``)."""
        for open_name in self._open:
            self._peaks[open_name] = max(self._peaks.get(open_name, 0), int(peak_b))

    def peaks_gib(self) -> dict[str, float]:
        """Peak allocated GiB per stage name (max over its entries); {} on CPU."""
        return {k: v / 2**30 for k, v in self._peaks.items()}

    def ms(self) -> dict[str, float]:
        """Milliseconds per stage name (summed over its entries); synchronises on CUDA."""
        if self._cuda:
            torch.cuda.synchronize(self.device)
            return {k: sum(a.elapsed_time(b) for a, b in v) for k, v in self._spans.items()}
        return {k: sum(v) * 1e3 for k, v in self._spans.items()}


class Laps:
    """Durations of consecutive spans of one device's work, without stalling its stream.

    On CUDA each ``mark()`` records an event on the current stream (the host runs on, so a
    span costs no host-device synchronisation and blocks keep overlapping the host's launches);
    ``ms()`` synchronises once. On a CPU a mark is ``time.perf_counter()``.

    Usage::

        laps = Laps(z.device)
        laps.mark()
        for block in blocks:
            z = block(z)
            laps.mark()
        laps.ms()  # one duration per block, ms
    """

    def __init__(self, device: torch.device | str) -> None:
        self._cuda = torch.device(device).type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def ms(self) -> list[float]:
        """Milliseconds between consecutive marks (``len(marks) - 1`` values); synchronises on CUDA."""
        pairs = list(zip(self._marks, self._marks[1:]))
        if self._cuda:
            if self._marks:
                self._marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in pairs]
        return [(b - a) * 1e3 for a, b in pairs]


def maybe_stage(timer: StageTimer | None, name: str) -> contextlib.AbstractContextManager:
    """``timer.stage(name)``, or a no-op when there is no timer."""
    return timer.stage(name) if timer is not None else contextlib.nullcontext()


def now_s(like: torch.Tensor) -> float:
    """Wall clock in seconds, after the work queued on ``like``'s device (CUDA) has finished."""
    if like.is_cuda:
        torch.cuda.synchronize(like.device)
    return time.perf_counter()
