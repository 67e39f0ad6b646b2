"""Collecting a SLURM sweep: every submitted point ends as a result row, whatever SLURM did.

The controller polls until each job is over. A job over means one of:

* rank 0 returned (submitit's result pickle): the job wrote its own ``result.json``; a job
  whose Python raised gets a row with status ``error`` and the exception;
* SLURM ended it without a result (time limit, node failure, memory kill, cancel, a crash
  before Python ran): a row with status ``timeout`` (time limit) or ``error``, the SLURM
  state and the probe points measured so far (``probe_state.json``).

Rows written here carry no signature, so ``resume=true`` runs those points again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict

from cpbench import results
from cpbench.launcher.slurm_state import CAUSE_OF_STATE, STATUS_OF_STATE, SlurmState, StateReader

log = logging.getLogger("cpbench")

# After SLURM says a job ended on its own, how long its result pickle may take to appear
# (shared file systems). A job SLURM killed (TIMEOUT, CANCELLED, ...) wrote none: no wait.
RESULT_GRACE_S = 15.0
ENDED_ON_ITS_OWN = frozenset({"COMPLETED", "FAILED"})


@dataclass
class Submitted:
    """A planned job and its submitit handle."""

    job: Any            # cpbench.launcher.slurm.PlannedJob
    slurm_job: Any      # submitit.slurm.slurm.SlurmJob (one sub-job per task when cp > 1)
    submitted_at: float

    @property
    def job_id(self) -> str:
        return self.slurm_job.job_id

    def rank0_paths(self) -> Any:
        """submitit's paths (stdout, stderr, result pickle) of task 0."""
        sub = getattr(self.slurm_job, "_sub_jobs", None)
        return (sub[0] if sub else self.slurm_job).paths


# ---------------------------------------------------------------------- before submission

def _task_config(config) -> Any:
    """The point's config as the job sees it: without the ``hydra`` node."""
    cfg = config.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def previous_result(job) -> dict | None:
    """With ``resume=true``: the result.json (in the job's dir or the sweep) with this point's signature."""
    if not job.config.get("resume"):
        return None
    from cpbench.config import signature_config
    from cpbench.job import find_previous

    cfg = _task_config(job.config)
    signature = results.point_signature(signature_config(cfg))
    found = find_previous(signature, job.out_dir, Path(str(job.config.hydra.sweep.dir)))
    return found[1] if found else None


def job_return(job, record: dict) -> JobReturn:
    """A completed JobReturn for a point whose row exists (failures are rows, not exceptions)."""
    from cpbench.job import one_line

    ret = JobReturn(overrides=job.overrides, cfg=None, hydra_cfg=None, working_dir=str(job.out_dir),
                    task_name="cpbench", status=JobStatus.COMPLETED)
    ret.return_value = one_line(record)
    return ret


def submitted_return(s: Submitted) -> JobReturn:
    ret = JobReturn(overrides=s.job.overrides, working_dir=str(s.job.out_dir), task_name="cpbench",
                    status=JobStatus.COMPLETED)
    ret.return_value = f"submitted as SLURM job {s.job_id}"
    return ret


def write_manifest(path: Path, submitted: list[Submitted]) -> None:
    """``slurm_jobs.json`` in the sweep dir: which SLURM job runs which point, and its logs."""
    entries = []
    if path.exists():
        try:
            entries = [e for e in results.read_json(path).get("jobs", [])
                       if e.get("num") not in {s.job.idx for s in submitted}]
        except (OSError, ValueError):
            entries = []
    for s in submitted:
        paths = s.rank0_paths()
        r = s.job.resources
        entries.append({"num": s.job.idx, "slurm_job_id": s.job_id, "overrides": s.job.overrides,
                        "cp": r.cp, "nodes": r.nodes, "tasks_per_node": r.tasks_per_node,
                        "gpus_per_node": r.gpus_per_node, "output_dir": str(s.job.out_dir),
                        "stdout": str(paths.stdout), "stderr": str(paths.stderr),
                        "submitted_at": s.submitted_at})
    results.write_json_atomic(path, {"jobs": sorted(entries, key=lambda e: e["num"])})


def announce(submitted: list[Submitted], sweep_dir: Path) -> None:
    """``wait=false``: say what was submitted and how to get the report later."""
    ids = " ".join(s.job_id for s in submitted) or "(none: every point already has a result)"
    print(f"cpbench: submitted SLURM jobs: {ids}\n"
          f"cpbench: sweep dir: {sweep_dir} (each job's result.json in its numbered subdir; "
          f"logs in {sweep_dir}/.submitit/)\n"
          f"cpbench: when they are done: python -m cpbench.report {sweep_dir}", flush=True)


# ---------------------------------------------------------------------- waiting

def collect(submitted: list[Submitted], poll_s: float, gpus_per_node: int, total: int) -> dict[int, JobReturn]:
    """Wait for every job; one JobReturn per job number, each a row (never an exception)."""
    reader = StateReader()
    pending = {s.job.idx: s for s in submitted}
    ended_at: dict[int, float] = {}
    returns: dict[int, JobReturn] = {}
    done = total - len(submitted)
    while pending:
        unfinished = [s for s in pending.values() if not s.rank0_paths().result_pickle.exists()]
        states = reader.states([s.job_id for s in unfinished]) if unfinished else {}
        for idx, s in list(pending.items()):
            state = states.get(s.job_id)
            if s.rank0_paths().result_pickle.exists():
                returns[idx] = _from_pickle(s, state, gpus_per_node)
            elif state is not None and (state.terminal or state.state == "GONE"):
                first = ended_at.setdefault(idx, time.monotonic())
                if state.state in ENDED_ON_ITS_OWN and time.monotonic() - first < RESULT_GRACE_S:
                    continue
                returns[idx] = _failure(s, state, gpus_per_node, "")
            else:
                continue
            done += 1
            del pending[idx]
            record = _fresh_record(s)
            log.info("cpbench: [%d/%d] SLURM job %s done: %s", done, total, s.job_id,
                     _one_line(record) if record else returns[idx].return_value)
        if pending:
            time.sleep(poll_s)
    return returns


def _one_line(record: dict) -> str:
    from cpbench.job import one_line

    return one_line(record)


def _from_pickle(s: Submitted, state: SlurmState | None, gpus_per_node: int) -> JobReturn:
    """Task 0 returned: its JobReturn (the job wrote result.json) or a failure row."""
    from submitit.core import utils as submitit_utils

    try:
        outcome, value = submitit_utils.pickle_load(s.rank0_paths().result_pickle)
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
    # The job may have written its row before failing (e.g. in Hydra's teardown): keep it.
    own = _fresh_record(s)
    if own is not None:
        return job_return(s.job, own)
    return _failure(s, state or SlurmState(s.job_id), gpus_per_node, message)


def _fresh_record(s: Submitted) -> dict | None:
    path = s.job.out_dir / results.RESULT_FILE
    try:
        if path.stat().st_mtime >= s.submitted_at:
            return results.read_json(path)
    except (OSError, ValueError):
        pass
    return None


def _failure(s: Submitted, state: SlurmState, gpus_per_node: int, message: str) -> JobReturn:
    """Write the row of a job that ended without reporting; returns its JobReturn."""
    from cpbench.job import write_unreported

    own = _fresh_record(s)
    if own is not None and not message:
        return job_return(s.job, own)
    cause = CAUSE_OF_STATE.get(state.state, f"SLURM state {state.state}")
    status = STATUS_OF_STATE.get(state.state, "error")
    text = f"SLURM job {s.job_id} {state.state}: {cause}"
    if message:
        text += f"; {message}"
    if state.reason and state.reason not in ("None", "none"):
        text += f" (reason {state.reason})"
    paths = s.rank0_paths()
    fields: dict = {"slurm": state.as_record() | {"stdout": str(paths.stdout), "stderr": str(paths.stderr)}}
    fields.update(_probe_progress(s.job.out_dir))
    cfg = _task_config(s.job.config)
    if cfg.get("device") == "auto":
        with open_dict(cfg):
            cfg.device = "cuda" if gpus_per_node else "cpu"  # what the job would have resolved
    record = write_unreported(cfg, status, text, fields, s.job.out_dir, s.job.idx,
                              overrides=list(OmegaConf.to_container(s.job.config.hydra.overrides.task)),
                              started=s.submitted_at)
    return job_return(s.job, record)


def _probe_progress(out_dir: Path) -> dict:
    """The probe points the job measured before it was killed (its probe_state.json)."""
    from cpbench.probe import STATE_FILE

    path = out_dir / STATE_FILE
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    points = state.get("points") or []
    fitting = [p["N"] for p in points if p.get("fits")]
    failing = [p["N"] for p in points if not p.get("fits")]
    return {"points": points, "max_n": max(fitting) if fitting else None,
            "first_fail_n": min(failing) if failing else None, "depth": state.get("depth")}
