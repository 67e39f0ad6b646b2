"""Job states from SLURM: ``sacct`` where accounting runs, else ``scontrol show job``.

submitit learns a job's state from ``sacct`` only; on a cluster without slurmdbd (a small
cluster, the CI one) every state reads UNKNOWN and a job that SLURM killed before it wrote
its result would be waited for forever. ``scontrol`` knows every job for ``MinJobAge``
seconds (default 300) after it ended, which is all the controller needs.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass

log = logging.getLogger("cpbench")

# States after which the job will not run again. PREEMPTED is one only when the cluster does
# not requeue preempted jobs (a requeued one comes back PENDING within seconds: the collector
# waits a grace period before it believes PREEMPTED).
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED", "PREEMPTED"})
# Pending reasons that will not clear by waiting: the request exceeds what the partition or
# the cluster has (SLURM accepts such jobs unless EnforcePartLimits is set). The controller
# cancels these jobs and records why.
NEVER_STARTS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                          "InvalidAccount", "InvalidQOS"})
# What each terminal state means for the point (cpbench's status; the state stays in the record).
STATUS_OF_STATE = {"TIMEOUT": "timeout", "DEADLINE": "timeout"}
CAUSE_OF_STATE = {
    "TIMEOUT": "SLURM time limit reached (hydra.launcher.timeout_min)",
    "DEADLINE": "SLURM deadline reached",
    "NODE_FAIL": "a node of the job failed",
    "OUT_OF_MEMORY": "SLURM killed the job for exceeding its host memory (hydra.launcher.mem_gb)",
    "CANCELLED": "the job was cancelled (scancel or an administrator)",
    "BOOT_FAIL": "a node of the job failed to boot",
    "FAILED": "the job exited with a non-zero code",
    "PREEMPTED": "the job was preempted and not requeued",
    "COMPLETED": "the job completed without a result",
    "GONE": "SLURM no longer knows the job",
    "PENDING": "the job can never start as requested; cancelled (more ranks, nodes or time than the partition allows?)",
}


@dataclass(frozen=True)
class SlurmState:
    """One job's state as SLURM reports it (``state`` is UNKNOWN while SLURM does not say)."""

    job_id: str
    state: str = "UNKNOWN"
    reason: str = ""
    exit_code: str = ""
    node_list: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def never_starts(self) -> bool:
        """Pending for a reason waiting will not clear (see ``NEVER_STARTS``)."""
        return self.state == "PENDING" and self.reason in NEVER_STARTS

    def as_record(self) -> dict:
        return {"job_id": self.job_id, "state": self.state, "reason": self.reason,
                "exit_code": self.exit_code, "node_list": self.node_list}


class StateReader:
    """Polls the states of many jobs (``"123"`` or array tasks ``"123_4"``) in few commands."""

    def __init__(self) -> None:
        self._sacct_works: bool | None = None  # unknown until the first call

    def states(self, job_ids: list[str]) -> dict[str, SlurmState]:
        """The state of each of ``job_ids``; a job SLURM does not list reads UNKNOWN."""
        found: dict[str, SlurmState] = {}
        if job_ids and self._sacct_works is not False:
            found = self._sacct(job_ids)
        if job_ids and self._sacct_works is False:
            found = self._scontrol(job_ids)
        return {j: found.get(j, SlurmState(j)) for j in job_ids}

    def _sacct(self, job_ids: list[str]) -> dict[str, SlurmState]:
        cmd = ["sacct", "-n", "-P", "-X", "-o", "JobID,State,Reason,ExitCode,NodeList",
               "-j", ",".join(sorted({j.split("_")[0] for j in job_ids}))]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("sacct failed (%s); using scontrol", exc)
            self._sacct_works = False
            return {}
        if out.returncode != 0:
            # "Slurm accounting storage is disabled": no slurmdbd on this cluster.
            if self._sacct_works is None:
                log.info("sacct unavailable (%s); job states from scontrol", out.stderr.strip()[:120])
            self._sacct_works = False
            return {}
        self._sacct_works = True
        found = {}
        for line in out.stdout.splitlines():
            fields = line.split("|")
            if len(fields) < 5:
                continue
            jid, state, reason, exit_code, nodes = fields[:5]
            # "CANCELLED by 0" -> CANCELLED
            st = SlurmState(jid, state.split()[0] if state else "UNKNOWN", reason, exit_code, nodes)
            for key in _expand_array_id(jid):
                found[key] = SlurmState(key, st.state, st.reason, st.exit_code, st.node_list)
        return found

    def _scontrol(self, job_ids: list[str]) -> dict[str, SlurmState]:
        found: dict[str, SlurmState] = {}
        for main_id in sorted({j.split("_")[0] for j in job_ids}):
            try:
                out = subprocess.run(["scontrol", "show", "job", "-o", main_id], capture_output=True,
                                     text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode != 0:
                # "Invalid job id specified": ended more than MinJobAge ago (or never existed).
                if "invalid job id" in (out.stderr + out.stdout).lower():
                    for j in job_ids:
                        if j.split("_")[0] == main_id:
                            found[j] = SlurmState(j, "GONE")
                continue
            for line in out.stdout.splitlines():
                fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))
                if "JobState" not in fields:
                    continue
                array_id, task = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
                keys = ([f"{array_id}_{t}" for t in _expand_range(task)] if array_id and task
                        else [fields.get("JobId", main_id)])
                for key in keys:
                    found[key] = SlurmState(key, fields["JobState"], fields.get("Reason", ""),
                                            fields.get("ExitCode", ""), fields.get("NodeList", ""))
        return found


def _expand_range(spec: str) -> list[str]:
    """``"0-2,5%4"`` -> ["0", "1", "2", "5"] (a pending array's unsplit tasks)."""
    out = []
    for part in spec.split("%")[0].split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += [str(i) for i in range(int(lo), int(hi) + 1)]
        elif part:
            out.append(part)
    return out


def _expand_array_id(job_id: str) -> list[str]:
    """sacct's ``123_[0-2%4]`` -> ["123_0", "123_1", "123_2"]; ``123_4`` and ``123`` unchanged."""
    m = re.fullmatch(r"(\d+)_\[(.+)\]", job_id)
    if not m:
        return [job_id]
    return [f"{m.group(1)}_{t}" for t in _expand_range(m.group(2))]
