"""A probe under a real CPU memory cap: max N measured to fit, first failing N measured to fail.

The growing test adapter allocates ``[N/cp, N, 64]`` float32 per rank per step; under
``memory.limit_gib=0.25`` (RLIMIT_DATA above the worker's baseline) the allocation fails for
real in torch's CPU allocator, which must count as ``oom``. Re-running the two boundary N as
timing points must reproduce ``ok`` and ``oom``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpbench.harness.memory import MEASURE_CPU
from cpbench.harness.runner import Runner
from cpbench.harness.slots import SupervisorGroup, discover_slots
from cpbench.routines.probe import Probe
from cpbench.routines.timing import run_timing

from helpers.run import compose_point

GROWING = ["model=adapter", "model._target_=tests.helpers.faults.GrowingAdapter"]


def test_probe_under_cpu_memory_cap_finds_a_measured_boundary():
    point = compose_point("device=cpu", "cp=2", "memory.limit_gib=0.25", "timing.warmup=3", "timing.repeats=5",
                          *GROWING)
    point = replace(point, probe=replace(point.probe, start=512, granularity=256, timeout_s=60))
    slots = discover_slots(point.cp, point.device)
    runner = Runner(point, slots, SupervisorGroup(slots))

    out = Probe(point, runner, None, "sig").run()
    max_n, fail_n = out["max_n"], out["first_fail_n"]
    assert max_n is not None and fail_n is not None and 0 < fail_n - max_n <= 256
    by_n = {p["N"]: p for p in out["points"]}
    assert by_n[max_n]["fits"] and by_n[fail_n]["status"] == "oom"
    assert "can't allocate memory" in out["first_fail_message"]
    # The cap is 0.25 GiB above the baseline: the largest fitting point used most of it.
    assert 0.1 < out["peak_alloc_gib"] <= 0.25
    assert out["depth_verified"] is True  # peak does not depend on run_blocks for this adapter

    fits = run_timing(replace(point, N=max_n, N_atoms=8 * max_n), runner, None)
    fails = run_timing(replace(point, N=fail_n, N_atoms=8 * fail_n), runner, None)
    assert fits["status"] == "ok" and len(fits["times_ms"]) == 5 and fits["memory_measure"] == MEASURE_CPU
    assert fails["status"] == "oom" and "can't allocate memory" in fails["message"]


@pytest.mark.parametrize("message", ["could not create a primitive", "std::bad_alloc"])
def test_allocation_failures_outside_torch_count_as_oom_only_under_the_cpu_cap(monkeypatch, message):
    """oneDNN says only "could not create a primitive" when its buffers cannot be allocated, and a
    C++ ``new`` inside an op only "std::bad_alloc": an out-of-memory verdict where this process
    runs under the CPU cap, a bug elsewhere."""
    from cpbench.harness import memory

    exc = RuntimeError(message)
    assert not memory.is_oom(exc)
    monkeypatch.setattr(memory, "_cpu_capped", True)
    assert memory.is_oom(exc)
    assert not memory.is_oom(RuntimeError("shape mismatch"))
