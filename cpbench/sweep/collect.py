"""Collecting a SLURM sweep: every submitted point ends as a result row, whatever SLURM did.

A job is over when one of these happens:

* Rank 0 returned (submitit's result pickle exists). The job wrote its own ``result.json``.
  A job whose Python raised gets a row with status ``error`` and the exception.
* SLURM ended it without a result (time limit, node failure, memory kill, cancel, a crash
  before Python ran). It gets a row with status ``timeout`` (time limit) or ``error``, the
  SLURM state, and the probe points measured so far (``probe_state.json``).

Rows written here carry no signature, so ``resume=true`` runs those points again.

The controller collects while it waits (``hydra.launcher.wait=true``). After
``wait=false``, the same happens later from the sweep's ``slurm_jobs.json``::

    python -m cpbench.sweep.collect SWEEP_DIR [--wait]   # rows for killed jobs, then the report
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict

from cpbench import results
from cpbench.config import signature_config
from cpbench.job import JobContext, write_unreported
from cpbench.sweep.slurm_state import CAUSE_OF_STATE, STATUS_OF_STATE, SlurmState, StateReader

log = logging.getLogger("cpbench")

MANIFEST_FILE = "slurm_jobs.json"
# After SLURM says a job ended on its own, how long its result pickle may take to appear
# (shared file systems), and how long a PREEMPTED job may take to come back PENDING when the
# cluster requeues it. A job SLURM killed (TIMEOUT, CANCELLED, ...) wrote none: no wait.
RESULT_GRACE_S = 15.0
GRACE_STATES = frozenset({"COMPLETED", "FAILED", "PREEMPTED"})


@dataclass
class Submitted:
    """A submitted point. ``entry`` is its line in ``slurm_jobs.json``.

    Attributes:
        job: the planned job (``cpbench.sweep.slurm.PlannedJob``).
        slurm_job: submitit's handle (one sub-job per task when cp > 1).
        entry: job number, SLURM job id, resources, task config, output dir, log paths.
    """

    job: Any
    slurm_job: Any
    entry: dict = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return self.slurm_job.job_id


def submitted(job, slurm_job, submitted_at: float) -> Submitted:
    """Pair a planned job with its submitit handle and describe both for the manifest."""
    sub = getattr(slurm_job, "_sub_jobs", None)
    paths = (sub[0] if sub else slurm_job).paths  # task 0's stdout, stderr, result pickle
    r = job.resources
    entry = {
        "num": job.idx, "slurm_job_id": slurm_job.job_id, "overrides": job.overrides,
        "cp": r.cp, "nodes": r.nodes, "tasks_per_node": r.tasks_per_node, "gpus_per_node": r.gpus_per_node,
        "output_dir": str(job.out_dir),
        "stdout": str(paths.stdout), "stderr": str(paths.stderr), "result_pickle": str(paths.result_pickle),
        "submitted_at": submitted_at,
        "task_overrides": list(OmegaConf.to_container(job.config.hydra.overrides.task)),
        "config": _container(task_config(job.config)),
    }
    return Submitted(job, slurm_job, entry)


def task_config(config: DictConfig) -> DictConfig:
    """The point's config as the job sees it: without the ``hydra`` node."""
    cfg = config.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def _container(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation only a job can resolve: keep it as text
        return OmegaConf.to_container(cfg, resolve=False)


# ---------------------------------------------------------------------- before submission

def previous_result(job) -> dict | None:
    """With ``resume=true``: the result.json (in the job's dir or the sweep) with this point's signature."""
    if not job.config.get("resume"):
        return None
    signature = results.point_signature(signature_config(task_config(job.config)))
    found = results.find_previous(signature, job.out_dir, Path(str(job.config.hydra.sweep.dir)))
    return found[1] if found else None


def job_return(overrides: list[str], out_dir: str | Path, record: dict) -> JobReturn:
    """A completed JobReturn for a point whose row exists (failures are rows, not exceptions)."""
    ret = JobReturn(overrides=overrides, working_dir=str(out_dir), task_name="cpbench", status=JobStatus.COMPLETED)
    ret.return_value = results.one_line(record)
    return ret


def submitted_return(s: Submitted) -> JobReturn:
    ret = JobReturn(overrides=s.job.overrides, working_dir=str(s.job.out_dir), task_name="cpbench",
                    status=JobStatus.COMPLETED)
    ret.return_value = f"submitted as SLURM job {s.job_id}"
    return ret


def refused_return(job, reason: str, submitted_at: float) -> JobReturn:
    """The row of a point sbatch refused (status ``error``, sbatch's message)."""
    cfg = task_config(job.config)
    if cfg.get("device") == "auto":
        cfg.device = "cuda" if job.resources.gpus_per_node else "cpu"
    r = job.resources
    text = (f"sbatch refused the job ({r.nodes} node(s) x {r.tasks_per_node} task(s)"
            f"{f', {r.gpus_per_node} GPUs/node' if r.gpus_per_node else ''}): {reason}")
    ctx = JobContext(Path(job.out_dir), True, job.idx, overrides=list(OmegaConf.to_container(
        job.config.hydra.overrides.task)), started_s=submitted_at)
    record = write_unreported(cfg, "error", text, {"slurm": {"job_id": None, "state": "REFUSED", "reason": reason}}, ctx)
    return job_return(job.overrides, job.out_dir, record)


def write_manifest(path: Path, subs: list[Submitted]) -> None:
    """``slurm_jobs.json``: which SLURM job runs which point; entries of earlier submissions kept."""
    nums = {s.entry["num"] for s in subs}
    entries = [e for e in read_manifest(path) if e.get("num") not in nums] + [s.entry for s in subs]
    results.write_json_atomic(path, {"jobs": sorted(entries, key=lambda e: e["num"])})


def read_manifest(path: Path) -> list[dict]:
    try:
        return results.read_json(path).get("jobs", [])
    except (OSError, ValueError):
        return []


def announce(subs: list[Submitted], sweep_dir: Path) -> None:
    """``wait=false``: say what was submitted and how to collect it later."""
    ids = " ".join(s.job_id for s in subs) or "(none: every point already has a result)"
    print(f"cpbench: submitted SLURM jobs: {ids}\n"
          f"cpbench: sweep dir: {sweep_dir} (each job's result.json in its numbered subdir; "
          f"logs in {sweep_dir}/.submitit/)\n"
          f"cpbench: when they are done: python -m cpbench.report {sweep_dir}\n"
          f"cpbench: (rows for jobs SLURM killed: python -m cpbench.sweep.collect {sweep_dir})", flush=True)


# ---------------------------------------------------------------------- waiting

def collect(subs: list[Submitted], poll_s: float, total: int, done: int = 0) -> dict[int, JobReturn]:
    """Wait for every job; one JobReturn per job number, each a row (never an exception).

    ``total`` jobs in the sweep, ``done`` of them already over (resumed or refused).
    """
    reader = StateReader()
    pending = {s.entry["num"]: s for s in subs}
    ended_at: dict[int, float] = {}
    returns: dict[int, JobReturn] = {}
    while pending:
        unfinished = [s for s in pending.values() if not Path(s.entry["result_pickle"]).exists()]
        states = reader.states([s.job_id for s in unfinished]) if unfinished else {}
        for num, s in list(pending.items()):
            state = states.get(s.job_id)
            if Path(s.entry["result_pickle"]).exists():
                returns[num] = _from_pickle(s.entry, state)
            elif state is not None and state.never_starts:
                returns[num] = _cancel_never_starting(s.entry, state)
            elif _over(state, ended_at.setdefault(num, time.monotonic()) if _is_end(state) else None):
                returns[num] = _failure(s.entry, state, "")
            else:
                if not _is_end(state):
                    ended_at.pop(num, None)  # requeued: running or pending again
                continue
            done += 1
            del pending[num]
            record = _fresh_record(s.entry)
            log.info("cpbench: [%d/%d] SLURM job %s done: %s", done, total, s.job_id,
                     results.one_line(record) if record else returns[num].return_value)
        if pending:
            time.sleep(poll_s)
    return returns


def _is_end(state: SlurmState | None) -> bool:
    return state is not None and (state.terminal or state.state == "GONE")


def _over(state: SlurmState | None, ended_since: float | None) -> bool:
    """Ended, and past the grace for a result pickle that a job ending on its own may still write."""
    if ended_since is None or state is None:
        return False
    return state.state not in GRACE_STATES or time.monotonic() - ended_since >= RESULT_GRACE_S


def _from_pickle(entry: dict, state: SlurmState | None) -> JobReturn:
    """Task 0 returned: its JobReturn (the job wrote result.json) or a failure row."""
    from submitit.core import utils as submitit_utils

    try:
        outcome, value = submitit_utils.pickle_load(Path(entry["result_pickle"]))
    except Exception as exc:  # noqa: BLE001 - a torn or unreadable pickle is a failure row
        outcome, value = "error", f"unreadable submitit result: {exc}"
    if outcome == "success" and isinstance(value, JobReturn) and value.status == JobStatus.COMPLETED:
        return value
    if outcome == "success" and isinstance(value, JobReturn):
        err = value._return_value
        message = f"{type(err).__name__}: {err}" if isinstance(err, BaseException) else str(err)
    else:
        lines = [ln for ln in str(value).strip().splitlines() if ln.strip()]
        message = lines[-1] if lines else "the job raised"
    return _failure(entry, state or SlurmState(entry["slurm_job_id"]), message)


def _cancel_never_starting(entry: dict, state: SlurmState) -> JobReturn:
    """A job pending for a reason that never clears: cancel it and record why."""
    log.error("cpbench: SLURM job %s cannot start (pending: %s); cancelling it", entry["slurm_job_id"], state.reason)
    subprocess.run(["scancel", entry["slurm_job_id"]], capture_output=True, timeout=60)
    return _failure(entry, state, "")


def _fresh_record(entry: dict) -> dict | None:
    """The job's own result.json, if written since it was submitted."""
    path = Path(entry["output_dir"]) / results.RESULT_FILE
    try:
        if path.stat().st_mtime >= entry["submitted_at"]:
            return results.read_json(path)
    except (OSError, ValueError):
        pass
    return None


def _failure(entry: dict, state: SlurmState, message: str) -> JobReturn:
    """Write the row of a job that ended without reporting (unless it wrote one); its JobReturn."""
    own = _fresh_record(entry)
    if own is not None:
        return job_return(entry["overrides"], entry["output_dir"], own)
    cause = CAUSE_OF_STATE.get(state.state, f"SLURM state {state.state}")
    text = f"SLURM job {entry['slurm_job_id']} {state.state}: {cause}"
    if message:
        text += f"; {message}"
    if state.reason and state.reason.lower() != "none":
        text += f" (reason {state.reason})"
    fields: dict = {"slurm": state.as_record() | {"stdout": entry["stdout"], "stderr": entry["stderr"]}}
    fields.update(_probe_progress(Path(entry["output_dir"])))
    cfg = OmegaConf.create(entry["config"])
    if cfg.get("device") == "auto":
        cfg.device = "cuda" if entry["gpus_per_node"] else "cpu"  # what the job would have resolved: GPUs if it asked
    ctx = JobContext(Path(entry["output_dir"]), True, entry["num"], overrides=entry["task_overrides"],
                     started_s=entry["submitted_at"])
    record = write_unreported(cfg, STATUS_OF_STATE.get(state.state, "error"), text, fields, ctx)
    return job_return(entry["overrides"], entry["output_dir"], record)


def _probe_progress(out_dir: Path) -> dict:
    """The probe points the job measured before it was killed (its probe_state.json)."""
    try:
        state = json.loads((out_dir / results.PROBE_STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    points = state.get("points") or []
    fitting = [p["N"] for p in points if p.get("fits")]
    # a timed-out point bounds nothing (as in the probe): in timed_out_n, never first_fail_n
    failing = [p["N"] for p in points if not p.get("fits") and p.get("status") != "timeout"]
    return {"points": [{k: v for k, v in p.items() if k != "order"} for p in points],
            "max_n": max(fitting) if fitting else None,
            "first_fail_n": min(failing) if failing else None,
            "timed_out_n": sorted(p["N"] for p in points if p.get("status") == "timeout"), "depth": state.get("depth")}


# ---------------------------------------------------------------------- later (wait=false)

def collect_later(sweep_dir: Path, wait: bool, poll_s: float) -> tuple[int, int]:
    """Rows for the manifest's jobs that SLURM ended without one; returns (over, still running).

    Without ``wait`` it still waits out the grace of jobs that just ended (``GRACE_STATES``).
    """
    entries = read_manifest(sweep_dir / MANIFEST_FILE)
    reader = StateReader()
    ended_at: dict[str, float] = {}
    while True:
        todo = [e for e in entries if _fresh_record(e) is None]
        states = reader.states([e["slurm_job_id"] for e in todo]) if todo else {}
        running, settling = [], []
        for e in todo:
            jid, state = e["slurm_job_id"], states[e["slurm_job_id"]]
            if Path(e["result_pickle"]).exists():
                _from_pickle(e, state)
            elif state.never_starts:
                _cancel_never_starting(e, state)
            elif _over(state, ended_at.setdefault(jid, time.monotonic()) if _is_end(state) else None):
                _failure(e, state, "")
            elif _is_end(state):
                settling.append(e)
            else:
                ended_at.pop(jid, None)
                running.append(e)
        if not settling and (not running or not wait):
            return len(entries) - len(running), len(running)
        time.sleep(min(poll_s, 1.0) if settling else poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.sweep.collect",
        description="Write result rows for the jobs of a SLURM sweep that SLURM ended without one "
                    "(after hydra.launcher.wait=false), then build the sweep's report.")
    parser.add_argument("dir", type=Path, help="the sweep directory (holds slurm_jobs.json)")
    parser.add_argument("--wait", action="store_true", help="wait until every job is over")
    parser.add_argument("--poll-s", type=float, default=30.0, help="seconds between state polls with --wait")
    args = parser.parse_args(argv)
    if not (args.dir / MANIFEST_FILE).exists():
        print(f"cpbench.sweep.collect: error: {args.dir}: no {MANIFEST_FILE} (not a SLURM sweep dir)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    over, running = collect_later(args.dir, args.wait, args.poll_s)
    print(f"cpbench: {over} job(s) over, {running} still queued or running")
    if over:
        from cpbench.report import build_report

        written = build_report(args.dir)
        print(f"cpbench: report {written.get('markdown')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
