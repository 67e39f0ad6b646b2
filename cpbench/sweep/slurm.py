"""``hydra/launcher=slurm``: one SLURM job per sweep point, with the resources its cp needs.

    python -m cpbench -m hydra/launcher=slurm cp=4,8,16 hydra.launcher.partition=gpu

The stock submitit launcher (hydra-submitit-launcher) sends a whole multirun with one resource
spec. This one reuses it and differs in three places:

* ``launch``: groups the sweep's points by what each needs (``resources_for``: one task per
  rank, ``gpus_per_node`` ranks per node) and submits each group as one job array; ``wait=false``
  returns once submitted (job ids and the sweep dir printed, a manifest written).
* ``__call__`` (on the nodes, once per SLURM task = rank slot): only rank 0 writes Hydra's
  ``.hydra/`` files; a SIGTERM (requeue, preemption, scancel) ends the task without recording
  the interrupted probe point, so a requeued probe continues from ``probe_state.json``.
* collection (``cpbench.sweep.collect``): a job that SLURM killed or that died becomes a
  result row with its cause and SLURM state; the others are still collected.

``checkpoint`` is the stock one (resubmit the same point): submitit calls it on the time-limit
signal and requeues the job up to ``max_num_timeout`` times; the harness's probe state makes
the resubmitted point continue where it stopped.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from cpbench.sweep.resources import JobResources, partition_has_gpus, resources_for
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

log = logging.getLogger("cpbench")

# Keys of cpbench/conf/hydra/launcher/slurm.yaml that are cpbench's, not submitit's.
OWN_KEYS = ("gpus_per_node", "wait", "poll_s", "sigterm_grace_s")
# Submitit settings the launcher derives from cp; setting them would contradict the point.
DERIVED_KEYS = ("nodes", "tasks_per_node")
# submitit's generic (executor-independent) parameters; every other key is a slurm_ one.
GENERIC_KEYS = frozenset(OmegaConf.structured(BaseQueueConf).keys()) - {"submitit_folder"}


class LauncherConfigError(ValueError):
    """A launcher setting that cannot work (one line naming the key)."""


class PlannedJob:
    """One sweep point as the controller sees it before submission.

    Attributes:
        idx: Hydra's job number (``hydra.job.num``).
        overrides: the point's overrides (``cp=N`` appended when the sweep left cp=auto).
        config: the point's composed config (with its ``hydra`` node).
        out_dir: the job's Hydra output directory (where result.json lands).
        resources: what SLURM is asked for.
    """

    def __init__(self, idx: int, overrides: list[str], config: DictConfig, out_dir: Path,
                 resources: JobResources):
        self.idx, self.overrides, self.config, self.out_dir, self.resources = (
            idx, overrides, config, out_dir, resources)

    def describe(self) -> str:
        r = self.resources
        gpus = f", {r.gpus_per_node} GPUs/node" if r.gpus_per_node else ""
        return (f"#{self.idx} {' '.join(filter_overrides(self.overrides))} -> {r.nodes} node(s) x "
                f"{r.tasks_per_node} task(s){gpus}")


class GroupedSlurmLauncher(BaseSubmititLauncher):
    """Hydra launcher: one SLURM job (one task per rank) per sweep point, grouped into arrays.

    Parameters are cpbench/conf/hydra/launcher/slurm.yaml: every submitit SLURM setting, plus
    ``gpus_per_node`` (0 = CPU cluster), ``wait``, ``poll_s`` and ``sigterm_grace_s``.
    """

    _EXECUTOR = "slurm"

    # ------------------------------------------------------------------ controller side
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from cpbench.sweep import collect

        assert self.config is not None and self.hydra_context is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._check_params()
            planned = [self._plan(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
        except LauncherConfigError as exc:
            # One line, before anything is submitted (SystemExit passes Hydra's error report).
            print(f"cpbench: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

        returns: dict[int, JobReturn] = {}
        to_submit = []
        for job in planned:
            previous = collect.previous_result(job)
            if previous is not None:
                log.info("cpbench: %s: resume, result.json already has this point (%s)",
                         job.describe(), previous.get("status"))
                returns[job.idx] = collect.job_return(job.overrides, job.out_dir, previous)
            else:
                to_submit.append(job)

        submitted, refused = self._submit(to_submit, sweep_dir) if to_submit else ([], {})
        returns.update(refused)
        if submitted:
            collect.write_manifest(sweep_dir / collect.MANIFEST_FILE, submitted)
        if not self.params.get("wait", True):
            collect.announce(submitted, sweep_dir)
            returns.update({s.job.idx: collect.submitted_return(s) for s in submitted})
        else:
            returns.update(collect.collect(submitted, poll_s=float(self.params.get("poll_s", 5)),
                                           total=len(planned), done=len(planned) - len(submitted)))
        return [returns[job.idx] for job in planned]

    def _check_params(self) -> None:
        self._gpus_per_node()
        for key in DERIVED_KEYS:
            if self.params.get(key) not in (None, 1):
                raise LauncherConfigError(
                    f"hydra.launcher.{key}={self.params[key]}: derived from cp (one task per rank); set "
                    "hydra.launcher.gpus_per_node (ranks per node) instead")
        if self.params.get("use_srun") is False:
            raise LauncherConfigError("hydra.launcher.use_srun=false: each rank is one srun task; leave it true")

    def _gpus_per_node(self) -> int:
        value = self.params.get("gpus_per_node")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LauncherConfigError(
                f"hydra.launcher.gpus_per_node={value}: 0 (CPU cluster) or the GPUs of one node")
        return value

    @functools.cached_property
    def _partition_gpus(self) -> bool | None:
        """``partition_has_gpus`` for the launcher's partition, asked once per launcher."""
        partition = self.params.get("partition")
        has_gpus = partition_has_gpus(partition)
        if has_gpus is False:
            log.info("cpbench: partition %s has no GPU (sinfo): device=auto points run on the CPU and ask for "
                     "no GPU", partition or "(default)")
        return has_gpus

    def _plan(self, overrides: list[str], idx: int) -> PlannedJob:
        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        config = loader.load_sweep_config(self.config, overrides)
        # A point that runs on the CPU asks for no GPU: device=cpu, or device=auto where the
        # partition has no GPU (sinfo); a CPU-only cluster refuses any GPU request ("Invalid
        # generic resource (gres) specification").
        device = config.get("device")
        on_cpu = device == "cpu" or (device == "auto" and self._partition_gpus is False)
        gpus_per_node = 0 if on_cpu else self._gpus_per_node()
        cp = config.get("cp")
        if cp == "auto":
            from cpbench.config import AUTO_CP_ON_CPU

            # The job cannot count GPUs before it has them: auto means one full node here.
            cp = gpus_per_node or AUTO_CP_ON_CPU
            overrides = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "cp"] + [f"cp={cp}"]
            config = loader.load_sweep_config(self.config, overrides)
        if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
            raise LauncherConfigError(f"cp={cp}: a positive integer or auto (under hydra/launcher=slurm)")
        with open_dict(config):
            config.hydra.job.num = idx
        try:
            out_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        except Exception:  # noqa: BLE001 - a subdir pattern that needs the SLURM job id
            out_dir = Path(str(self.config.hydra.sweep.dir)) / str(idx)
        # emulate=true: rank 0 of cp=K alone, one task and one GPU (cpbench.harness.emulation)
        from cpbench.config import emulate_enabled

        emulate = config.get("emulate")
        ranks = 1 if emulate_enabled(OmegaConf.to_container(emulate) if isinstance(emulate, DictConfig) else emulate) else cp
        return PlannedJob(idx, overrides, config, out_dir, resources_for(ranks, gpus_per_node))

    def _executor(self, resources: JobResources) -> Any:
        """A submitit executor with the user's settings and ``resources``."""
        import submitit

        params = dict(self.params)
        for key in DERIVED_KEYS + OWN_KEYS:
            params.pop(key, None)
        folder = params.pop("submitit_folder")
        executor = submitit.AutoExecutor(cluster="slurm", folder=folder,
                                         slurm_max_num_timeout=params.pop("max_num_timeout", 3))
        extras = dict(params.pop("additional_parameters", None) or {})
        extras.update(resources.sbatch_extras())
        params["name"] = f"{params.get('name') or 'cpbench'}_cp{resources.cp}"
        params.update(resources.submitit_params())
        executor.update_parameters(
            **{k if k in GENERIC_KEYS else f"slurm_{k}": v for k, v in params.items()},
            slurm_additional_parameters=extras)
        return executor

    def _submit(self, planned: list[PlannedJob], sweep_dir: Path) -> tuple[list, dict[int, JobReturn]]:
        """Submit one array per resource group; a group sbatch refuses becomes rows, not a stop."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        from cpbench.sweep.collect import refused_return
        from cpbench.sweep.collect import submitted as describe_submitted

        groups: dict[JobResources, list[PlannedJob]] = defaultdict(list)
        for job in planned:
            groups[job.resources].append(job)
        log.info("cpbench: submitting %d SLURM job(s) in %d array(s); sweep dir %s", len(planned),
                 len(groups), sweep_dir)
        submitted, refused = [], {}
        submitted_at = time.time()
        for resources, jobs in groups.items():
            for job in jobs:
                log.info("cpbench:   %s", job.describe())
            executor = self._executor(resources)
            args = [(job.overrides, "hydra.sweep.dir", job.idx, f"job_id_for_{job.idx}", Singleton.get_state())
                    for job in jobs]
            try:
                slurm_jobs = executor.map_array(self, *zip(*args))
            except (FailedJobError, FailedSubmissionError) as exc:
                # e.g. "Requested node configuration is not available": more ranks than a node has.
                reason = " ".join(str(exc).split())[:300]
                log.error("cpbench: sbatch refused %d job(s) (cp=%d): %s", len(jobs), resources.cp, reason)
                refused.update({job.idx: refused_return(job, reason, submitted_at) for job in jobs})
                continue
            submitted += [describe_submitted(job, sj, submitted_at) for job, sj in zip(jobs, slurm_jobs)]
        return sorted(submitted, key=lambda s: s.job.idx), refused

    # ------------------------------------------------------------------ node side
    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> JobReturn:
        """Run one sweep point in this SLURM task (one rank slot of the runner)."""
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        env = submitit.JobEnvironment()
        _end_task_on_sigterm(float(self.params.get("sigterm_grace_s", 5)))
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        with open_dict(sweep_config.hydra.job) as job:
            job.id = env.job_id
            job.num = job_num
        if env.global_rank != 0:
            # Rank 0 owns the job's files (.hydra/, result.json, <job>.log): the others would
            # race it, so they keep no .hydra/ and log to <job>_rank<r>.log.
            with open_dict(sweep_config.hydra):
                sweep_config.hydra.output_subdir = None
                handler = OmegaConf.select(sweep_config, "hydra.job_logging.handlers.file")
                log_file = OmegaConf.to_container(handler, resolve=False).get("filename") if handler else None
                if isinstance(log_file, str) and log_file.endswith(".log"):
                    handler.filename = f"{log_file[:-len('.log')]}_rank{env.global_rank}.log"
        return run_job(hydra_context=self.hydra_context, task_function=self.task_function,
                       config=sweep_config, job_dir_key=job_dir_key, job_subdir_key="hydra.sweep.subdir")


def _end_task_on_sigterm(grace_s: float) -> None:
    """Make SIGTERM end this task without recording anything.

    SLURM sends SIGTERM to every process of a job it requeues, preempts or cancels. submitit
    ignores it (it waits for its own signal), so the supervisor would see its worker die and
    record the interrupted point as failed in probe_state.json, and the requeued probe would
    trust that. Instead the task waits ``grace_s`` for submitit's signal (clusters that send
    it after SIGTERM still get their checkpoint and requeue), then exits at once.
    """

    def handler(signum: int, frame: Any) -> None:
        print(f"cpbench: SIGTERM: SLURM is ending this job (requeue, preemption or cancel); "
              f"exiting in {grace_s:g} s without recording the running point", file=sys.stderr, flush=True)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            time.sleep(0.1)  # submitit's handler may run (and exit) meanwhile
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
