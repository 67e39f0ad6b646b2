"""Per-point worker processes: rank slots, rendezvous, rank agreement, timeouts, verdicts.

Execution model::

    job ── supervisor, one per rank slot (CPU only; never touches the GPU)
             └── worker, one per rank, a fresh process for every probe point / timing run

The rank slots and the supervisors' group are ``cpbench.harness.slots``. Every verdict is
agreed by a polling all-reduce over that group (any rank failed → every supervisor kills its
workers after a short grace period).

A point's verdict: ``ok`` when every rank completed; else the root cause — ``oom`` when any
rank ran out of memory, ``timeout`` when ranks were still running at the point's timeout,
``error`` with the failing rank's one-line exception (or exit code) otherwise. Errors that
only echo a dead peer (gloo "connection closed", NCCL aborts) are never the root cause.

A worker's output (its traceback, a native crash's stack) lives in a temporary folder that goes
with the point; a rank that ended in ``error`` or ``timeout`` leaves a copy in the job's folder,
``worker_logs/N<N>-rank<R>.log``, which the job's log names (a rank whose error only echoes a
dead peer leaves none where another local rank failed otherwise).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cpbench.config import Point
from cpbench.harness.env import usable_cpu_count
from cpbench.harness.slots import Slots, SupervisorGroup

log = logging.getLogger("cpbench")

POLL_S = 0.1
# Peers of a failed rank usually sit in a collective that never returns: after this grace
# period (enough for them to report an error of their own) they are killed. A rank out of
# memory needs no grace: it is the verdict whatever the peers report (``verdict``).
FAIL_GRACE_S = 3.0
# Messages of ranks that failed only because a peer died first.
_PEER_FAILURE_MARKERS = ("connection closed by peer", "connection reset", "broken pipe", "peer",
                         "nccl communicator was aborted", "process group", "timed out", "socket")
# Environment a worker must not inherit from a torchrun/SLURM supervisor: it joins the point's
# own group through an explicit tcp:// address (and TORCHELASTIC_* would make its rank 0 a
# client of torchrun's agent store instead of the point's store server: a silent hang).
_SUPERVISOR_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class PointRun:
    """What the workers of one point do: one step (probe) or warmup + repeats (timing)."""

    N: int
    n_atoms: int
    S: int
    timeout_s: float
    warmup: int = 0
    repeats: int = 1
    run_blocks: int | None = None
    lean: bool = False                # run_step(..., lean=True): the adapter's irreducible peak
    profile_path: str | None = None   # "{rank}" is replaced by the rank
    count_collectives: bool = False   # an adapter that counts none: one more, untimed step counts them
    memory_breakdown: bool = False    # one more, untimed step under the profiler (harness/breakdown.py)
    breakdown_sites: str = "function"  # its sites by function (Python stacks) or by op (none)


@dataclass
class PointResult:
    """The agreed verdict of one point and every rank's outcome (ordered by rank)."""

    status: str
    message: str
    ranks: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def per_rank(self, key: str) -> list:
        return [r.get(key) for r in self.ranks]


class Runner:
    """Runs points of one job on its rank slots; every call starts fresh workers."""

    def __init__(self, point: Point, slots: Slots, group: SupervisorGroup, log_dir: Path | None = None):
        """``log_dir``: where failed ranks' logs are kept (``worker_logs/``); None keeps none."""
        self.point, self.slots, self.group, self.log_dir = point, slots, group, log_dir

    def run(self, task: PointRun) -> PointResult:
        started = time.time()
        port = self.group.worker_port()
        work_dir = Path(tempfile.mkdtemp(prefix=f"cpbench-N{task.N}-"))
        procs: list[tuple[int, subprocess.Popen]] = []  # filled as they start: the finally sees each one
        try:
            self._spawn(task, port, work_dir, procs)
            timed_out = self._wait(procs, task.timeout_s, work_dir)
            local = [self._outcome(rank, proc, work_dir, timed_out) for rank, proc in procs]
            self._keep_logs(local, work_dir, task.N)
        finally:
            # no-op when all exited; on an exception (Ctrl-C, SIGTERM: cpbench.__main__) ends them
            self._kill(procs)
            shutil.rmtree(work_dir, ignore_errors=True)
        ranks = sorted(self.group.gather(local), key=lambda r: r["rank"])
        status, message = verdict(ranks, timed_out, task.timeout_s)
        return PointResult(status, message, ranks, time.time() - started)

    def _keep_logs(self, outcomes: list[dict], work_dir: Path, N: int) -> None:
        """Copy to ``log_dir`` the logs of the local ranks that timed out or failed with an error of
        their own; one that only echoes a dead peer is kept only where no local rank failed otherwise
        (not beside a rank that ran out of memory, the usual verdict of a probe)."""
        if self.log_dir is None:
            return
        echoes = [o for o in outcomes if o["status"] == "error" and _is_peer_echo(o.get("message", ""))]
        own = [o for o in outcomes if o["status"] in ("error", "timeout") and o not in echoes]
        other_failure = own or any(o["status"] == "oom" for o in outcomes)
        for outcome in own + ([] if other_failure else echoes):
            kept = Path(self.log_dir) / "worker_logs" / f"N{N}-rank{outcome['rank']}.log"
            try:
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(work_dir / f"rank{outcome['rank']}.log", kept)
            except OSError as exc:
                log.warning("could not keep rank %d's log: %s", outcome["rank"], exc)
                continue
            log.info("N=%d rank %d %s; its log: %s", N, outcome["rank"], outcome["status"], kept)

    def _spawn(self, task: PointRun, port: int, work_dir: Path, procs: list[tuple[int, subprocess.Popen]]) -> None:
        p = self.point
        spec = {
            "device": p.device, "world_size": p.cp if p.emulate else self.slots.world_size,
            "emulate": p.emulate, "comm_reserve_gib": p.comm_reserve_gib, "master_addr": self.slots.master_addr
            if self.slots.num_supervisors > 1 else "127.0.0.1", "master_port": port,
            "mesh_shape": list(p.mesh_shape), "mesh_dim_names": list(p.mesh_dim_names),
            "model": p.model, "seed": p.seed, "train": p.train, "memory_limit_gib": p.memory_limit_gib,
            "N": task.N, "n_atoms": task.n_atoms, "S": task.S, "run_blocks": task.run_blocks, "lean": task.lean,
            "warmup": task.warmup, "repeats": task.repeats, "profile_path": task.profile_path,
            "count_collectives": task.count_collectives, "memory_breakdown": task.memory_breakdown,
            "breakdown_sites": task.breakdown_sites,
            "timeout_s": task.timeout_s, "work_dir": str(work_dir),
            # The cores this job may use, shared by its local ranks: oversubscribed intra-op threads
            # distort CPU times (each parallel region waits for a descheduled thread).
            "threads": max(1, usable_cpu_count() // len(self.slots.ranks)),
        }
        (work_dir / "spec.json").write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items()
               if k not in _SUPERVISOR_ENV and not k.startswith("TORCHELASTIC_")}
        alloc_conf = p.worker_alloc_conf()
        if alloc_conf is not None:
            env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
        for rank, dev in zip(self.slots.ranks, self.slots.device_indices):
            with open(work_dir / f"rank{rank}.log", "wb") as logf:
                # A new session per worker: its whole process group can be killed at once.
                procs.append((rank, subprocess.Popen(
                    [sys.executable, "-m", "cpbench.harness.worker", str(work_dir / "spec.json"), str(rank), str(dev)],
                    stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)))

    def _wait(self, procs: list[tuple[int, subprocess.Popen]], timeout_s: float, work_dir: Path) -> bool:
        """Poll until every rank is done; kill all on a failure (at once when a rank ran out of
        memory, else after a grace) or the timeout.

        Returns whether the point timed out. Every supervisor runs the same number of
        all-reduces per loop, so the loop ends on the same iteration everywhere.
        """
        deadline = time.monotonic() + timeout_s
        failed_at = None
        while True:
            codes = [(rank, proc.poll()) for rank, proc in procs]
            failed_ranks = [rank for rank, c in codes if c not in (None, 0)]
            local_running = int(any(c is None for _, c in codes))
            local_oom = int(any(_reported(work_dir, rank).get("status") == "oom" for rank in failed_ranks))
            now = time.monotonic()
            failed, running, late, oom = self.group.any_all(
                [int(bool(failed_ranks)), local_running, int(now > deadline), local_oom])
            if not running:
                return False
            if failed and failed_at is None:
                failed_at = now
            if late or oom or (failed_at is not None and now - failed_at > FAIL_GRACE_S):
                self._kill(procs)
                return bool(late and failed_at is None)
            time.sleep(POLL_S)

    @staticmethod
    def _kill(procs: list[tuple[int, subprocess.Popen]]) -> None:
        for _, proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for _, proc in procs:
            proc.wait()

    @staticmethod
    def _outcome(rank: int, proc: subprocess.Popen, work_dir: Path, timed_out: bool) -> dict:
        reported = _reported(work_dir, rank)
        if reported:
            return reported
        code = proc.returncode
        progress = _progress(work_dir, rank)
        if code is not None and code < 0 and -code == signal.SIGKILL:
            status = "timeout" if timed_out else "killed"
            message = "still running at the point's timeout" if timed_out else "killed after a peer failed"
            if timed_out:
                message += f" {progress_text(progress)}"
        else:
            status, message = "error", f"exited with code {code} without a report{_log_tail(work_dir, rank)}"
        return {"rank": rank, "status": status, "message": message, "peak_alloc_gib": None,
                "peak_reserved_gib": None, "exit_code": code, "progress": progress}


def _reported(work_dir: Path, rank: int) -> dict:
    """A finished rank's outcome (``rank<R>.json``, written before its exit); {} without one."""
    try:
        return json.loads((work_dir / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


def _progress(work_dir: Path, rank: int) -> dict:
    """The steps a rank finished before it was killed (``cpbench.harness.worker`` writes them)."""
    try:
        return json.loads((work_dir / f"rank{rank}.progress.json").read_text())
    except (OSError, ValueError):
        return {}


def progress_text(progress: dict) -> str:
    """``after 2 steps (warmup 61234 ms, 60987 ms)``: how far a timed-out rank got."""
    warmup, timed = progress.get("warmup_ms") or [], progress.get("times_ms") or []
    if not warmup and not timed:
        return "before its first step finished"
    parts = [f"warmup {', '.join(f'{t:.0f}' for t in warmup)} ms"] if warmup else []
    parts += [f"timed {', '.join(f'{t:.0f}' for t in timed)} ms"] if timed else []
    return f"after {len(warmup) + len(timed)} steps ({'; '.join(parts)})"


def _log_tail(work_dir: Path, rank: int) -> str:
    """What a rank's log says of its end: the last line, or for a native crash (faulthandler's
    ``Fatal Python error: ...``, worker.main) that line and the innermost frame of the crashing
    thread's stack, which faulthandler prints most recent call first."""
    try:
        lines = [ln.strip() for ln in (work_dir / f"rank{rank}.log").read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return ""
    fatal = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Fatal Python error:")), None)
    if fatal is not None:
        frame = next((ln for ln in lines[fatal + 1:] if ln.startswith("File ")), None)
        return f" ({lines[fatal][:200]}{'; in ' + frame[:200] if frame else ''})"
    return f" ({lines[-1][:300]})" if lines else ""


def _is_peer_echo(message: str) -> bool:
    text = message.lower()
    return any(m in text for m in _PEER_FAILURE_MARKERS)


def verdict(ranks: list[dict], timed_out: bool, timeout_s: float) -> tuple[str, str]:
    """(status, message) of a point from its per-rank outcomes (see the module docstring)."""
    failed = [r for r in ranks if r["status"] not in ("ok", "killed", "timeout")]
    if not failed:
        if timed_out:
            late = [r for r in ranks if r["status"] == "timeout"]
            first = progress_text(late[0].get("progress") or {}) if late else ""
            return "timeout", (f"rank(s) {[r['rank'] for r in late]} still running after {timeout_s:g} s "
                               f"(killed); rank {late[0]['rank'] if late else '-'} {first}")
        if all(r["status"] == "ok" for r in ranks):
            return "ok", ""
        return "error", "workers were killed without a failing rank"
    ooms = [r for r in failed if r["status"] == "oom"]
    roots = ooms or [r for r in failed if not _is_peer_echo(r.get("message", ""))] or failed
    root = min(roots, key=lambda r: (r.get("finished_at", math.inf), r["rank"]))
    return root["status"], f"rank {root['rank']}: {root.get('message', '')}"
