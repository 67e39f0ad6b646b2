"""One rank of one probe point or timing run, in a fresh process (``python -m cpbench.harness.worker``).

Started by the runner (``cpbench.harness.runner``) with ``SPEC_JSON RANK DEVICE_INDEX``; it joins the
point's process group (nccl on GPU, gloo on CPU) over a fresh port, builds the DeviceMesh
(``("cp",)`` or ``("cp0", "cp1")``), caps its memory, seeds torch identically on every rank
before ``build_model`` and before ``build_batch``, runs the step(s), writes its outcome to
``<work_dir>/rank<R>.json`` and leaves with ``os._exit`` so that no teardown (a process group
whose peer died, CUDA contexts) can hang it.

Outcome (one JSON per rank): ``status`` ok | oom | error, ``message`` (one line),
``peak_alloc_gib``, ``peak_reserved_gib``, ``memory_measure``, ``times_ms`` (timing repeats,
this rank), ``warmup_ms``, ``loss``, ``stats`` (the adapter's), ``seconds``,
``energy_j_per_step`` (NVML's energy counter over the timed repeats / repeats, this rank's GPU;
None when absent: ``cpbench.harness.energy``), ``memory_breakdown`` (with ``memory_breakdown``:
one more step, untimed, under the profiler: what this rank keeps at its peak,
``cpbench.harness.breakdown``). With ``count_collectives`` (timing) and more than one rank, an
adapter whose stats have no ``comm_step`` runs one more step, untimed, whose collectives
``cpbench.harness.collectives`` counts into its stats. After every step a
rank also writes ``<work_dir>/rank<R>.progress.json`` (``warmup_ms``, ``times_ms``, ``stats`` so
far), which the runner reads when the point times out: how far a too-slow point got.
"""

from __future__ import annotations

import datetime as _dt
import faulthandler
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from cpbench.results.record import write_json_atomic


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}"


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def run_rank(spec: dict, rank: int, device_index: int, outcome: dict) -> None:
    """Everything a rank does; fills ``outcome`` as it goes (read even when it raises)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from cpbench.harness import emulation, memory
    from cpbench.harness.energy import energy_per_step, gpu_energy_j
    from cpbench.models.api import adapter_stats, load_adapter

    torch.set_num_threads(max(1, int(spec["threads"])))
    if spec["device"] == "cuda":
        torch.cuda.set_device(device_index)
        device = torch.device("cuda", device_index)
    else:
        device = torch.device("cpu")
    if spec.get("emulate"):
        emulation.init_fake_group(rank, spec["world_size"])
    else:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{spec['master_addr']}:{spec['master_port']}",
            rank=rank, world_size=spec["world_size"],
            timeout=_dt.timedelta(seconds=float(spec["timeout_s"]) + 60),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    mesh = init_device_mesh(device.type, tuple(spec["mesh_shape"]), mesh_dim_names=tuple(spec["mesh_dim_names"]))
    # The model's code is imported before the cap: on a CPU the cap counts what the point
    # allocates, not the modules its adapter happens to import (torch._dynamo alone is tens of MiB).
    adapter = load_adapter(spec["model"])
    _barrier(device)  # every rank's transport is up before the cap is measured from here

    outcome["memory_limit"] = memory.apply_limit(spec["memory_limit_gib"], device, spec.get("comm_reserve_gib") or 0.0)
    peak = memory.PeakMemory(device)
    outcome["memory_measure"] = peak.measure
    peak.reset()

    torch.manual_seed(spec["seed"])
    model = adapter.build_model(mesh, device)
    torch.manual_seed(spec["seed"])
    batch = adapter.build_batch(spec["N"], spec["n_atoms"], spec["S"], mesh, device)
    step_kwargs = {"run_blocks": spec["run_blocks"]} if spec.get("run_blocks") is not None else {}
    if spec.get("lean"):
        step_kwargs["lean"] = True

    def step():
        return adapter.run_step(model, batch, spec["train"], **step_kwargs)

    warmup_ms, times_ms, fill_ms, loss = [], [], [], None
    emulated = bool(spec.get("emulate"))
    energy_start_j = None
    for i in range(spec["warmup"] + spec["repeats"]):
        profiling = spec.get("profile_path") and i == spec["warmup"]
        if profiling:
            prof = torch.profiler.profile(record_shapes=False, with_stack=False)
            prof.__enter__()
        _barrier(device)  # all ranks start the iteration together
        _sync(device)
        if i == spec["warmup"] and device.type == "cuda":
            energy_start_j = gpu_energy_j(device.index)  # NVML energy counter; None when absent
        emulation.FILLS.take_ms()  # start the emulation's fill clock at this step
        t0 = time.perf_counter()
        loss = step()
        _sync(device)
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        if emulated:  # the fills stand in for the collectives' writes: not this rank's compute
            filled_ms = emulation.FILLS.take_ms()
            elapsed_ms -= filled_ms
            if i >= spec["warmup"]:
                fill_ms.append(round(filled_ms, 4))
        _barrier(device)
        (warmup_ms if i < spec["warmup"] else times_ms).append(elapsed_ms)
        write_json_atomic(Path(spec["work_dir"]) / f"rank{rank}.progress.json",
                          {"warmup_ms": warmup_ms, "times_ms": times_ms, "stats": adapter_stats(adapter)})
        if profiling:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(spec["profile_path"].format(rank=rank))
    outcome["energy_j_per_step"] = energy_per_step(energy_start_j, gpu_energy_j(device.index)
                                                   if energy_start_j is not None else None, spec["repeats"])
    outcome["peak_alloc_gib"], outcome["peak_reserved_gib"] = peak.read_gib()
    outcome["warmup_ms"], outcome["times_ms"] = warmup_ms, times_ms
    if emulated:
        outcome["emulation_fill_ms"] = fill_ms
    outcome["loss"] = float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else None
    check_finite(outcome["loss"], adapter_stats(adapter))
    outcome["stats"] = adapter_stats(adapter)
    # An adapter that resets the CUDA peak per stage (stage_peak_gib) cleared the process peak too.
    stage_peaks = [v for v in (outcome["stats"].get("stage_peak_gib") or {}).values() if v is not None]
    outcome["peak_alloc_gib"] = max([outcome["peak_alloc_gib"], *stage_peaks])
    if spec.get("count_collectives") and dist.get_world_size() > 1 and "comm_step" not in outcome["stats"]:
        # the adapter counts no collectives (the reference trunk does): one more step, untimed, under
        # a dispatch mode that counts them (cpbench.harness.collectives), for the link model
        from cpbench.harness.collectives import count_step

        try:
            outcome["stats"].update(count_step(step, lambda: _sync(device)))
        except Exception as exc:  # noqa: BLE001 -- the timed steps stand; say why there are no counts
            outcome["stats"]["comm_count_error"] = _one_line(exc)
    if spec.get("memory_breakdown"):  # one more step, untimed, under the profiler (every rank: collectives)
        from cpbench.harness.breakdown import peak_breakdown

        try:
            outcome["memory_breakdown"] = peak_breakdown(step, device, model, batch, adapter,
                                                         sites=spec.get("breakdown_sites", "function"))
        except Exception as exc:  # noqa: BLE001 -- the timed steps stand; say why there is no breakdown
            outcome["memory_breakdown"] = {"error": _one_line(exc)}
    outcome["status"], outcome["message"] = "ok", ""


class NonFiniteStep(RuntimeError):
    """A step's loss or checked outputs held inf or NaN: its result is wrong, whatever it cost."""


def check_finite(loss: float | None, stats: dict) -> None:
    """Raise ``NonFiniteStep`` when the step's loss, or the outputs the adapter checked
    (``stats["outputs_finite"]``, the reference adapter's trunk and sampler outputs), are not
    finite: the point is an error, never a fit, on a real run as under emulation (where a
    receive buffer left unfilled would show here)."""
    if loss is not None and not math.isfinite(loss):
        raise NonFiniteStep(f"step loss {loss} is not finite")
    if stats.get("outputs_finite") is False:
        raise NonFiniteStep("step outputs are not finite")


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its supervisor dies (killed, timed out, Ctrl-C):
    a worker lives in its own session, so nothing else would end it."""
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor's own cleanup still kills it
    if os.getppid() == 1:  # the supervisor died before the request took effect
        os._exit(1)


def main(argv: list[str]) -> None:
    die_with_parent()
    # A native crash (a segmentation fault in a library under the CPU cap, an abort) leaves no
    # rank<R>.json: faulthandler writes its Python stack to this rank's log, which the runner
    # quotes (runner._log_tail) so the point's message says where the rank died.
    faulthandler.enable()
    spec_path, rank, device_index = argv[0], int(argv[1]), int(argv[2])
    spec = json.loads(Path(spec_path).read_text())
    started = time.time()
    outcome: dict = {"rank": rank, "status": "error", "message": "did not finish", "peak_alloc_gib": None,
                     "peak_reserved_gib": None}
    exit_code = 0
    try:
        run_rank(spec, rank, device_index, outcome)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a reported outcome
        from cpbench.harness.memory import is_oom

        outcome["status"] = "oom" if is_oom(exc) else "error"
        outcome["message"] = _one_line(exc)
        traceback.print_exc()
        exit_code = 1
    outcome["seconds"] = time.time() - started
    outcome["finished_at"] = time.time()
    write_json_atomic(Path(spec["work_dir"]) / f"rank{rank}.json", outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)  # never run teardown: a dead peer's process group can hang it


if __name__ == "__main__":
    main(sys.argv[1:])
