"""Hydra callbacks of a multirun (registered in cpbench/conf/config.yaml under ``hydra.callbacks``).

* ``on_multirun_start``: expand the sweep exactly as Hydra's BasicSweeper does, compose every
  point with the config loader's ``load_sweep_config`` and validate it; one bad point stops
  the multirun before any job starts (one line on stderr, exit code 2). It sets
  ``CPBENCH_SWEEP_TOTAL`` and tells the job module the sweep's points (an interrupted multirun
  lists those without a result).
* ``on_multirun_end``: aggregate every result.json under the sweep directory into the report
  (``cpbench.report.build_report``), also when some jobs failed. The report lands in the sweep
  directory only; ``report.out=PATH`` (relative to the launch directory) copies it to PATH too,
  so a multirun never writes into the directory it was started from unless asked.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from cpbench.config import ConfigError, InputFileError, resolve_point
from cpbench.job import SWEEP_STARTED_ENV, SWEEP_TOTAL_ENV, note_sweep

log = logging.getLogger("cpbench")


def sweep_overrides(config: DictConfig) -> list[list[str]]:
    """Every sweep point's overrides, in job order (BasicSweeper's expansion)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
    params += list(config.hydra.overrides.task)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    batches = BasicSweeper.split_arguments(parser.parse_overrides(params), None)
    return [list(job) for batch in batches for job in batch]


def validate_sweep(config: DictConfig) -> int:
    """Compose and validate every sweep point; returns the number of points.

    Raises:
        ConfigError: the first invalid point, its overrides appended to the message.
    """
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    points = sweep_overrides(config)
    for overrides in points:
        job_cfg = loader.load_sweep_config(config, overrides)
        with open_dict(job_cfg):
            job_cfg.pop("hydra", None)
        try:
            resolve_point(job_cfg)
        except InputFileError as exc:
            if len(points) == 1:
                raise
            # One bad input of several: that job records it as an error row; the others run.
            log.warning("cpbench: error: %s (sweep point %s is recorded as an error; the others run)",
                        exc, " ".join(overrides))
        except ConfigError as exc:
            if len(points) > 1:
                exc.allowed += f" (in sweep point {' '.join(overrides)})"
                exc.args = (f"{exc.key}={exc.value}: {exc.allowed}",)
            raise
    return len(points)


class CpbenchCallback(Callback):
    """Validates a multirun before it starts and builds its report when it ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            total = validate_sweep(config)
        except ConfigError as exc:
            print(f"cpbench: error: {exc}", file=sys.stderr)
            sys.stderr.flush()
            # SystemExit passes through Hydra's error reporting: one line, no traceback.
            raise SystemExit(2) from None
        os.environ[SWEEP_TOTAL_ENV] = str(total)
        # routine=auto: a probe lock older than this was left by an interrupted run (cpbench.job).
        os.environ[SWEEP_STARTED_ENV] = repr(time.time())
        # What an interrupted multirun lists as not started (cpbench.job.interrupt_line).
        note_sweep(sweep_overrides(config), Path(config.hydra.sweep.dir),
                   OmegaConf.select(config, "hydra.launcher._target_"))
        log.info("cpbench: %d sweep points validated", total)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        from cpbench.report import build_report  # pandas and matplotlib: only when a sweep ends
        if not any(sweep_dir.rglob("result.json")):
            # hydra.launcher.wait=false: the jobs are still queued; an empty report would
            # overwrite a report.out copy with nothing.
            log.info("cpbench: no result.json under %s yet; build the report later with "
                     "python -m cpbench.report %s", sweep_dir, sweep_dir)
            return
        out = OmegaConf.select(config, "report.out")
        if out:  # report.out=null (the default) or empty: the sweep directory only
            launch_dir = Path(OmegaConf.select(config, "hydra.runtime.cwd") or os.getcwd())
            out = Path(out) if Path(out).is_absolute() else launch_dir / out
        else:
            out = None
        baseline = OmegaConf.select(config, "report.baseline_max_n")
        try:
            kwargs = {"baseline_max_n": baseline} if baseline is not None else {}
            written = build_report(sweep_dir, out=out, **kwargs)
        except Exception:  # noqa: BLE001 - the results stay on disk; the report can be rebuilt
            log.exception("cpbench: building the report failed; rebuild with python -m cpbench.report %s", sweep_dir)
            return
        log.info("cpbench: report %s", ", ".join(str(p) for p in (written or {}).values()) or sweep_dir)
