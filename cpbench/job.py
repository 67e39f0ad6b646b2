"""One sweep point → one result record (``result.json`` in the job's Hydra output directory).

Expected outcomes are results, not exceptions: out of memory, timeouts, a crashing rank and
too few GPUs all become a record with their status, so a sweep always completes and the
report has a row for every point. Only a single (non-multirun) job with a config mistake or
too few GPUs raises ``ConfigError`` (the CLI turns it into one line and exit code 2).

``resume=true`` skips a point whose result.json (in its own output directory, or anywhere in
the sweep directory) carries the same signature: the resolved config minus
resume/report/hydra, plus the code version (``cpbench.results.point_signature``).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cpbench import results
from cpbench.config import ConfigError, Point, cpu_default_model, local_gpu_count, resolve_point, signature_config
from cpbench.runner import Runner, Slots, SupervisorGroup, discover_slots, point_record

log = logging.getLogger("cpbench")

# Set by the multirun callback (cpbench.callbacks) to the number of jobs in the sweep.
SWEEP_TOTAL_ENV = "CPBENCH_SWEEP_TOTAL"


def _hydra_info() -> tuple[Path, bool, int | None, Path | None, list[str], str | None]:
    """(output dir, is multirun, job number, sweep dir, task overrides, model choice) of this job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return Path.cwd(), False, None, None, [], None
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    return (Path(hc.runtime.output_dir), multirun, hc.job.get("num") if multirun else None,
            Path(hc.sweep.dir) if multirun else None, list(hc.overrides.task), hc.runtime.choices.get("model"))


def env_metadata(device: str) -> dict:
    """Run metadata: ``cpbench.env.env_metadata`` (with NVML GPU data) where it exists."""
    try:
        from cpbench.env import env_metadata as full
    except ImportError:
        return results.base_env_metadata()
    try:
        return full(device)
    except Exception:  # noqa: BLE001 - metadata must never lose a result
        return results.base_env_metadata()


def find_previous(signature: str, out_dir: Path, sweep_dir: Path | None) -> tuple[Path, dict] | None:
    """A result.json with ``signature`` in ``out_dir``, else anywhere under ``sweep_dir``."""
    own = out_dir / results.RESULT_FILE
    if own.exists():
        try:
            record = results.read_json(own)
            if record.get("signature") == signature:
                return own, record
        except (OSError, ValueError):
            pass
    if sweep_dir is not None and sweep_dir.exists():
        for path, record in results.iter_results(sweep_dir):
            if record.get("signature") == signature:
                return path, record
    return None


def _gpu_shortage(point: Point, slots: Slots) -> str | None:
    """Why the point cannot run with the GPUs here (None when it can)."""
    if point.device != "cuda":
        return None
    if slots.mode == "local":
        gpus = local_gpu_count()
        if point.cp > gpus:
            return f"cp={point.cp} needs {point.cp} GPUs, {gpus} visible here"
    return None


def run_job(cfg: DictConfig) -> dict:
    """Run one sweep point and write its result record; returns the record."""
    started = time.time()
    out_dir, multirun, job_num, sweep_dir, overrides, model_choice = _hydra_info()
    note = cpu_default_model(cfg, model_choice, overrides)
    if note:
        log.info("cpbench: %s", note)
    try:
        point = resolve_point(cfg)
    except ConfigError as exc:
        if not multirun:
            raise
        # The controller validated every point; a job can only get here through its environment.
        return _finish(cfg, None, "error", str(exc), {}, out_dir, job_num, overrides, started, write=True)

    signature = results.point_signature(signature_config(cfg))
    if cfg.get("resume"):
        previous = find_previous(signature, out_dir, sweep_dir)
        if previous is not None:
            path, record = previous
            log.info("%sresume: %s already has this point (%s), skipped", _progress(job_num),
                     path, record.get("status"))
            return record

    slots = discover_slots(point.cp, point.device)
    shortage = _gpu_shortage(point, slots)
    if shortage is not None:
        if not multirun:
            raise ConfigError("cp", point.cp, f"{shortage}: run it where cp GPUs are visible (or under SLURM)")
        return _finish(cfg, point, "insufficient_gpus", shortage, {}, out_dir, job_num, overrides, started,
                       signature=signature)
    if slots.world_size != point.cp:
        return _finish(cfg, point, "error", f"{slots.mode} launched {slots.world_size} ranks for cp={point.cp}",
                       {}, out_dir, job_num, overrides, started, signature=signature,
                       write=slots.supervisor_rank == 0)

    writer = slots.supervisor_rank == 0
    group = SupervisorGroup(slots)
    try:
        runner = Runner(point, slots, group)
        fields = _run_routine(point, runner, out_dir if writer else None, signature)
    finally:
        group.close()
    status, message = fields.pop("status"), fields.pop("message")
    if note:
        fields["notes"] = [note]
    return _finish(cfg, point, status, message, fields, out_dir, job_num, overrides, started,
                   signature=signature, write=writer)


def _run_routine(point: Point, runner: Runner, out_dir: Path | None, signature: str) -> dict:
    from cpbench.probe import STATE_FILE, run_probe
    from cpbench.timing import run_timing

    try:
        if point.routine == "probe":
            return run_probe(point, runner, out_dir / STATE_FILE if out_dir is not None else None, signature)
        return run_timing(point, runner, out_dir)
    except Exception as exc:  # noqa: BLE001 - a harness or adapter failure is a result row
        log.exception("%s failed", point.routine)
        return {"status": "error", "message": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}


def _finish(cfg: DictConfig, point: Point | None, status: str, message: str, fields: dict, out_dir: Path,
            job_num: int | None, overrides: list[str], started: float, signature: str | None = None,
            write: bool = True) -> dict:
    record = {
        "schema": results.SCHEMA_VERSION,
        "signature": signature,
        "code": results.code_version(),
        "point": point_record(point) if point else None,
        "routine": point.routine if point else cfg.get("routine"),
        "status": status,
        "message": message,
        **fields,
        "seconds_total": round(time.time() - started, 3),
        "overrides": overrides,
        "env": env_metadata(point.device if point else "cpu"),
        "config": OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        if point else OmegaConf.to_container(cfg, resolve=False),
    }
    if write:
        path = results.write_json_atomic(out_dir / results.RESULT_FILE, record)
        record["_path"] = str(path)
    log.info("%s%s", _progress(job_num), one_line(record))
    return record


def write_unreported(cfg: DictConfig, status: str, message: str, fields: dict, out_dir: Path,
                     job_num: int | None, overrides: list[str], started: float) -> dict:
    """The row of a point whose job never reported (SLURM killed it, or it died before writing).

    Written by the controller (``cpbench.launcher.collect``) into the job's output dir. No
    signature: ``resume=true`` runs the point again.
    """
    try:
        point = resolve_point(cfg)
    except ConfigError:
        point = None
    return _finish(cfg, point, status, message, fields, out_dir, job_num, overrides, started)


def _progress(job_num: int | None) -> str:
    if job_num is None:
        return ""
    total = os.environ.get(SWEEP_TOTAL_ENV)
    return f"[{job_num + 1}/{total}] " if total else f"[{job_num + 1}] "


def one_line(record: dict) -> str:
    """``cp=2 N=48 timing ok median 12.3 ms`` — what a person watching a sweep reads."""
    p = record.get("point") or {}
    head = f"{p.get('workflow', '?')} {p.get('topology', '?')} cp={p.get('cp', '?')}"
    status = record.get("status")
    if record.get("routine") == "probe":
        head += f" probe {status}"
        if record.get("max_n") is not None:
            head += f" max_n={record['max_n']}"
        if record.get("first_fail_n") is not None:
            head += f" first_fail_n={record['first_fail_n']} ({record.get('first_fail_status')})"
    else:
        head += f" N={p.get('N', '?')} timing {status}"
        if record.get("median_ms") is not None:
            head += f" median {record['median_ms']:.1f} ms"
    if status != "ok" and record.get("message"):
        head += f": {record['message'][:200]}"
    return head


def summary(record: dict) -> str:
    """A one-paragraph account of what the job did (printed by ``python -m cpbench``)."""
    p = record.get("point") or {}
    model = (p.get("model") or {}).get("name", "?")
    cap = p.get("memory_limit_gib")
    where = (f"model {model}, {p.get('workflow')} {p.get('topology')} cp={p.get('cp')} on {p.get('device')}"
             f"{f' with a {cap:g} GiB/rank memory cap' if cap else ''}")
    path = record.get("_path", "result.json")
    if record.get("routine") == "probe":
        pts = record.get("points") or []
        text = f"cpbench probed the largest N that fits for {where}: "
        if record.get("max_n") is not None:
            peak = record.get("peak_alloc_gib")
            text += f"max N = {record['max_n']}" + (f" (peak {peak:.2f} GiB per rank)" if peak is not None else "")
        else:
            text += "no N fit"
        if record.get("first_fail_n") is not None:
            text += (f", first failing N = {record['first_fail_n']} ({record.get('first_fail_status')}: "
                     f"{(record.get('first_fail_message') or '')[:160]})")
        text += f"; {len(pts)} points tried, depth {record.get('depth')}"
    else:
        text = f"cpbench timed one {'training step' if p.get('workflow') == 'training' else 'inference step'} " \
               f"at N={p.get('N')} for {where}: status {record.get('status')}"
        if record.get("median_ms") is not None:
            text += (f", median {record['median_ms']:.2f} ms (IQR {record['iqr_ms']:.2f} ms over "
                     f"{len(record.get('times_ms', []))} repeats), peak {record.get('peak_alloc_gib') or 0:.2f} GiB, "
                     f"{record.get('tokens_per_s') or 0:.0f} tokens/s")
        elif record.get("message"):
            text += f" ({record['message'][:200]})"
    for note in record.get("notes") or []:
        text += f". Note: {note}"
    return text + f". Result: {path}"
