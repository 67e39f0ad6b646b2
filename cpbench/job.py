"""One sweep point → one result record (``result.json`` in the job's Hydra output directory).

Expected outcomes are results, not exceptions: out of memory, timeouts, a crashing rank and
too few GPUs all become a record with their status, so a sweep always completes and the
report has a row for every point. Only a single (non-multirun) job with a config mistake or
too few GPUs raises ``ConfigError`` (the CLI turns it into one line and exit code 2).

``resume=true`` skips a point whose result.json (in its own output directory, or anywhere in
the sweep directory) carries the same signature: the resolved config minus
resume/report/hydra, plus the code version (``cpbench.results.point_signature``).

``routine=auto`` (the default) resolves to a timing when the resolved config has an ``N`` (set
on the command line, by a sweep or experiment file, or by a real input) and to the probe when
``N`` is null (``config.resolve_routine``); the timing job then also makes sure its
configuration's max-N probe exists, exactly once per configuration (``ensure_probe``: a lock
file in the sweep dir decides which job runs it; the result lands in
``<sweep dir>/probes/<signature>/``).

An interrupted job (Ctrl-C, SIGTERM: ``cpbench.__main__`` turns both into ``KeyboardInterrupt``)
leaves what it finished on disk; ``interrupt_line`` says what that was and how to continue.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from cpbench import results
from cpbench.config import CONF_DIR, ConfigError, Point, resolve_point, signature_config
from cpbench.harness.devices import cuda_available, local_gpu_count
from cpbench.harness.env import env_metadata
from cpbench.harness.runner import Runner
from cpbench.harness.slots import Slots, SupervisorGroup, discover_slots
from cpbench.routines.probe import run_probe
from cpbench.routines.timing import run_timing

log = logging.getLogger("cpbench")

# Set by the multirun callback (cpbench.sweep.callbacks) to the number of jobs in the sweep.
SWEEP_TOTAL_ENV = "CPBENCH_SWEEP_TOTAL"
# Set by the multirun callback to the time the multirun started: a probe lock older than that
# without its result.json was left by an interrupted earlier run of the sweep (resume=true).
SWEEP_STARTED_ENV = "CPBENCH_SWEEP_STARTED"
# routine=auto with N: the configuration's max-N probe, once per configuration, lives in
# <sweep dir>/probes/<signature>/ (result.json, probe_state.json); <signature>.lock beside it.
PROBES_DIR = "probes"
# Keys the probe of a configuration does not depend on (the timing points' sizes).
PROBE_FREE_KEYS = ("N", "N_atoms")
# Keys of a group that only a timing reads (one more step after the timed ones): not the probe's.
PROBE_FREE_GROUP_KEYS = {"memory": ("breakdown", "breakdown_sites")}
# How far a probe may go, not what its points measure: a probe's saved points (probe_state.json)
# carry on under other values of these (a requeued job given a longer time limit, a probe split
# over several runs on a machine lent for minutes at a time).
PROBE_LIMIT_KEYS = ("budget_s", "max_points")
# Where a probe looks after a failure, not what its points measure: saved points carry on too.
PROBE_PATH_KEYS = ("floor",)


@dataclass(frozen=True)
class JobContext:
    """Where this job runs in Hydra's terms (a plain run outside Hydra: the working directory)."""

    out_dir: Path
    multirun: bool = False
    job_num: int | None = None
    sweep_dir: Path | None = None
    overrides: list[str] = field(default_factory=list)
    model_choice: str | None = None
    started_s: float = field(default_factory=time.time)


def hydra_context() -> JobContext:
    """This job's ``JobContext`` from Hydra's runtime config."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return JobContext(Path.cwd())
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    return JobContext(Path(hc.runtime.output_dir), multirun, hc.job.get("num") if multirun else None,
                      Path(hc.sweep.dir) if multirun else None, list(hc.overrides.task),
                      hc.runtime.choices.get("model"))


def cpu_default_model(cfg: DictConfig, model_choice: str | None, overrides: list[str]) -> str | None:
    """On a CPU, run the default reference trunk at its ``tiny`` preset's sizes (``cfg`` in place).

    The Boltz-2-sized trunk takes hours per probe point on a CPU; ``python -m cpbench`` should
    finish in minutes, so it probes the same code path at the tiny sizes. It keys on the model
    choice, not on how overrides are spelt: when the choice is the default ``pairformer`` and the
    command line did not name it, tiny's sizes replace the preset's, and every ``model.*`` key the
    user set stays (``model.kernels=torch``, ``model.blocks=4``: ``_kept_model_keys``). An explicit
    ``model=pairformer`` asks for the full size: nothing is swapped. Returns a note saying what was
    swapped and kept, or None when nothing was.
    """
    if model_choice != "pairformer" or any(o.lstrip("+~").split("=", 1)[0] == "model" for o in overrides):
        return None
    device = cfg.get("device")
    if not (device == "cpu" or (device == "auto" and not cuda_available())):
        return None
    kept = _kept_model_keys(cfg.model, overrides)
    tiny = OmegaConf.load(CONF_DIR / "model" / "tiny.yaml")
    tiny.pop("defaults", None)
    model = OmegaConf.merge(cfg.model, tiny)
    with open_dict(model):
        for key in kept:
            value = OmegaConf.select(cfg.model, key, default=_ABSENT)
            if value is _ABSENT:  # ~model.key: the user removed it, tiny must not bring it back
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(model, parent) if parent else model
                if node is not None and leaf in node:
                    del node[leaf]
            else:
                OmegaConf.update(model, key, value, merge=False)
    cfg.model = model
    kept_text = ", ".join(f"model.{k}" for k in kept)
    return ("model=tiny: on a CPU the default reference trunk runs at its tiny preset's sizes"
            + (f", keeping {kept_text}" if kept else "") + " (model=pairformer on the command line runs the full size)")


_ABSENT = object()


def _kept_model_keys(model: DictConfig, overrides: list[str]) -> list[str]:
    """The dotted ``model`` keys the CPU swap keeps: those a ``model.*`` override names, and those
    that differ from the pairformer preset (set by a config file such as an experiment)."""
    named = [key[len("model."):] for key in (o.lstrip("+~").split("=", 1)[0] for o in overrides) if key.startswith("model.")]
    preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "pairformer.yaml"), resolve=False)
    changed = _changed_keys(OmegaConf.to_container(model, resolve=False), preset)
    return list(dict.fromkeys(named + changed))


def _changed_keys(values: dict, preset: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose value in ``values`` differs from (or is absent in) ``preset``."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(preset.get(key), dict):
            out += _changed_keys(value, preset[key], f"{prefix}{key}.")
        elif key not in preset or preset[key] != value:
            out.append(f"{prefix}{key}")
    return out


_warned_bf16 = False


def _warn_emulated_bf16(point: Point) -> None:
    """``dtype=bf16`` on a CPU without bf16 units runs, slowly: say so once per process."""
    global _warned_bf16
    if point.device == "cpu" and point.dtype == "bf16" and "emulated" in point.dtype_reason and not _warned_bf16:
        _warned_bf16 = True
        log.warning("cpbench: dtype=bf16 on this CPU is emulated in software and runs many times slower than "
                    "fp32 (dtype=auto chooses fp32 here)")


def _gpu_shortage(point: Point, slots: Slots, overrides: list[str] | None = None) -> str | None:
    """Why the point cannot run with the GPUs here (None when it can), with the command that
    runs it where it fits (under SLURM: one task and one GPU per rank)."""
    if point.device != "cuda":
        return None
    if slots.mode == "local":
        gpus = local_gpu_count()
        if point.ranks_launched > gpus:
            args = [shlex.quote(o) for o in overrides or [f"cp={point.cp}"]]
            command = " ".join(["python -m cpbench -m hydra/launcher=slurm", *args])
            emulated = " ".join(["python -m cpbench", *(a for a in args if not a.startswith("emulate")), "emulate=true"])
            return (f"cp={point.cp} needs {point.cp} GPUs, {gpus} visible here; run it with: {command}; "
                    f"or emulate it on one GPU (per-rank memory and compute; communication modelled): {emulated}")
    return None


@dataclass
class _Seen:
    """What this process ran so far (read by ``interrupt_line``)."""

    job: JobContext | None = None          # the job started last
    routine: str | None = None             # its routine
    finished: set = field(default_factory=set)   # job numbers that returned (multirun)
    sweep_points: list[list[str]] | None = None  # every sweep point's overrides, in job order
    sweep_dir: Path | None = None
    launcher: str | None = None            # hydra.launcher._target_ of the multirun


_seen = _Seen()


def note_sweep(points: list[list[str]], sweep_dir: Path, launcher: str | None) -> None:
    """The multirun's points (called by ``cpbench.sweep.callbacks`` before any job starts)."""
    _seen.sweep_points, _seen.sweep_dir, _seen.launcher = points, sweep_dir, launcher


def run_job(cfg: DictConfig) -> dict:
    """Run one sweep point and write its result record; returns the record."""
    ctx = hydra_context()
    _seen.job, _seen.routine = ctx, cfg.get("routine")
    record = _run_job(cfg, ctx)
    _seen.finished.add(ctx.job_num)
    return record


def _run_job(cfg: DictConfig, ctx: JobContext) -> dict:
    note = cpu_default_model(cfg, ctx.model_choice, ctx.overrides)
    try:
        point = resolve_point(cfg)
    except ConfigError as exc:
        if not ctx.multirun:
            raise
        # The controller validated every point; a job can only get here through its environment.
        return finish(cfg, ctx, None, "error", str(exc))
    _seen.routine = point.routine
    auto_probe = cfg.get("routine") == "auto" and point.routine == "timing"
    # The first line states what runs (the resolved routine); the model swap's note follows it.
    log.info("%s%s", _progress(ctx.job_num), results.start_line(point.record(), point.routine, cfg.get("routine")))
    if note:
        log.info("%scpbench: %s", _progress(ctx.job_num), note)
    _warn_emulated_bf16(point)

    sig_config = signature_config(cfg)
    signature, state_signature = results.point_signature(sig_config), probe_state_signature(sig_config)
    if cfg.get("resume"):
        previous = results.find_previous(signature, ctx.out_dir, ctx.sweep_dir)
        if previous is not None:
            path, record = previous
            log.info("%sresume: %s already has this point (%s), skipped", _progress(ctx.job_num),
                     path, record.get("status"))
            return record

    slots = discover_slots(point.ranks_launched, point.device)
    shortage = _gpu_shortage(point, slots, ctx.overrides)
    if shortage is not None:
        if not ctx.multirun:
            raise ConfigError("cp", point.cp, shortage)
        return finish(cfg, ctx, point, "insufficient_gpus", shortage, signature=signature)
    if slots.world_size != point.ranks_launched:
        return finish(cfg, ctx, point, "error", f"{slots.mode} launched {slots.world_size} ranks for cp={point.cp}"
                      f"{' (emulated: 1 rank)' if point.emulate else ''}",
                      signature=signature, write=slots.supervisor_rank == 0)

    writer = slots.supervisor_rank == 0
    group = SupervisorGroup(slots)
    probe_ref = None
    try:
        if auto_probe:
            probe_ref = ensure_probe(cfg, ctx, slots, group, note)
        runner = Runner(point, slots, group, log_dir=ctx.out_dir)
        fields = _run_routine(point, runner, ctx.out_dir if writer else None, state_signature)
    finally:
        group.close()
    status, message = fields.pop("status"), fields.pop("message")
    if note:
        fields["notes"] = [note]
    if probe_ref is not None:
        fields["probe"] = probe_ref
    return finish(cfg, ctx, point, status, message, fields, signature=signature, write=writer)


# ---------------------------------------------------------------- routine=auto: the probe of a configuration

def probe_config(cfg: DictConfig) -> tuple[DictConfig, str]:
    """(the config of ``cfg``'s max-N probe, its signature): ``routine=probe``, and a signature
    without the keys a probe does not depend on (``PROBE_FREE_KEYS``), so that every timing point
    of one configuration (cp, workflow, model, ...) names the same probe."""
    probe_cfg = cfg.copy()
    with open_dict(probe_cfg):
        probe_cfg.routine = "probe"
    return probe_cfg, results.point_signature(_probe_signature_config(probe_cfg))


def _probe_signature_config(probe_cfg: DictConfig) -> dict:
    config = {k: v for k, v in signature_config(probe_cfg).items() if k not in PROBE_FREE_KEYS}
    for group, keys in PROBE_FREE_GROUP_KEYS.items():
        if isinstance(config.get(group), dict):
            config[group] = {k: v for k, v in config[group].items() if k not in keys}
    return config


def probe_state_signature(signature_config_: dict) -> str:
    """The identity of a probe's saved points (``probe_state.json``): the point's signature
    config without the probe's limits (``PROBE_LIMIT_KEYS``) and ``probe.floor`` (``PROBE_PATH_KEYS``)."""
    probe = {k: v for k, v in (signature_config_.get("probe") or {}).items()
             if k not in PROBE_LIMIT_KEYS + PROBE_PATH_KEYS}
    return results.point_signature(signature_config_ | {"probe": probe})


def _probe_decision(lock: Path, result: Path, signature: str, started: float, holder: str = "") -> str:
    """``done`` (the probe's result.json is there), ``run`` (this job took the lock) or ``other``
    (another job holds it). O_CREAT|O_EXCL is atomic on one filesystem, shared ones included;
    a lock older than this multirun's start without a result was left by an interrupted run
    and is taken over (renamed away first, so only one job can take it). The lock's first line
    names its ``holder`` (the job's output directory): a job that finds its own name there was
    requeued or resumed while it ran the probe, and takes it back."""
    if _has_result(result, signature):
        return "done"
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                stale = started > 0 and lock.stat().st_mtime < started
                mine = bool(holder) and lock.read_text().split("\n", 1)[0] == holder
            except FileNotFoundError:
                continue
            if mine:
                os.utime(lock)
                return "run"
            if not stale:
                return "other"
            try:
                os.rename(lock, lock.with_name(f"{lock.name}.stale.{os.getpid()}.{time.time_ns()}"))
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{holder}\n{os.uname().nodename} pid {os.getpid()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        return "run"
    return "other"


def _has_result(path: Path, signature: str) -> bool:
    try:
        return results.read_json(path).get("signature") == signature
    except (OSError, ValueError, AttributeError):
        return False


def ensure_probe(cfg: DictConfig, ctx: JobContext, slots: Slots, group: SupervisorGroup,
                 note: str | None = None) -> dict:
    """``routine=auto`` at a named N: make sure the configuration's max-N probe exists, once per
    configuration. The first job to take ``<sweep dir>/probes/<signature>.lock`` runs it (on all
    its rank slots) and writes ``<sweep dir>/probes/<signature>/result.json``; the others skip it.
    Returns the timing record's ``probe`` block: signature, path, and whether this job ran it."""
    probe_cfg, signature = probe_config(cfg)
    base = (ctx.sweep_dir or ctx.out_dir) / PROBES_DIR
    out_dir, lock = base / signature, base / f"{signature}.lock"
    result_path = out_dir / results.RESULT_FILE
    # A lock older than this run (a multirun: its controller's start) was left by an interrupted one.
    started = float(os.environ.get(SWEEP_STARTED_ENV) or 0) if ctx.multirun else ctx.started_s
    holder = str(Path(ctx.out_dir).resolve())
    decision = _probe_decision(lock, result_path, signature, started, holder) if slots.supervisor_rank == 0 else None
    decision = group.broadcast(decision)
    ref = {"signature": signature, "path": str(result_path), "ran_here": decision == "run",
           "state": {"done": "done", "run": "done", "other": "run by another job"}[decision]}
    if decision != "run":
        log.info("%sprobe of this configuration: %s (%s)", _progress(ctx.job_num),
                 "already done" if decision == "done" else "another job runs it", result_path)
        return ref
    point = resolve_point(probe_cfg)
    writer = slots.supervisor_rank == 0
    probe_ctx = replace(ctx, out_dir=out_dir, started_s=time.time(),
                        overrides=[o for o in ctx.overrides if o.split("=", 1)[0].lstrip("+~") not in PROBE_FREE_KEYS])
    log.info("%sprobe of this configuration (routine=auto): %s", _progress(ctx.job_num), out_dir)
    fields = _run_routine(point, Runner(point, slots, group, log_dir=out_dir), out_dir if writer else None,
                          probe_state_signature(_probe_signature_config(probe_cfg)))
    status, message = fields.pop("status"), fields.pop("message")
    fields["auto"] = {"by": str(ctx.out_dir)}
    if note:
        fields["notes"] = [note]
    record = finish(probe_cfg, probe_ctx, point, status, message, fields, signature=signature, write=writer)
    ref.update(status=record["status"], max_n=record.get("max_n"))
    return ref


def _run_routine(point: Point, runner: Runner, out_dir: Path | None, state_signature: str) -> dict:
    """The point's routine; a probe keeps its points in ``out_dir`` under ``state_signature``."""
    try:
        if point.routine == "probe":
            state_path = out_dir / results.PROBE_STATE_FILE if out_dir is not None else None
            return run_probe(point, runner, state_path, state_signature)
        return run_timing(point, runner, out_dir)
    except Exception as exc:  # noqa: BLE001 - a harness or adapter failure is a result row
        log.exception("%s failed", point.routine)
        return {"status": "error", "message": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}


def finish(cfg: DictConfig, ctx: JobContext, point: Point | None, status: str, message: str,
           fields: dict | None = None, *, signature: str | None = None, write: bool = True) -> dict:
    """Build the point's result record (the schema: ``cpbench.results.record``), write it into
    ``ctx.out_dir`` when ``write``, log its one line; returns it."""
    record = {
        "schema": results.SCHEMA_VERSION,
        "signature": signature,
        "code": results.code_version(),
        "point": point.record() if point else None,
        "routine": point.routine if point else cfg.get("routine"),
        "status": status,
        "message": message,
        **(fields or {}),
        "seconds_total": round(time.time() - ctx.started_s, 3),
        "overrides": ctx.overrides,
        "env": env_metadata(point.device if point else "cpu"),
        "config": OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        if point else OmegaConf.to_container(cfg, resolve=False),
    }
    if write:
        path = results.write_json_atomic(ctx.out_dir / results.RESULT_FILE, record)
        record["_path"] = str(path)
    log.info("%s%s", _progress(ctx.job_num), results.one_line(record))
    return record


def write_unreported(cfg: DictConfig, status: str, message: str, fields: dict, ctx: JobContext) -> dict:
    """The row of a point whose job never reported (SLURM killed it, or it died before writing).

    Written by the controller (``cpbench.sweep.collect``) into the job's output dir. No
    signature: ``resume=true`` runs the point again.
    """
    try:
        point = resolve_point(cfg)
    except ConfigError:
        point = None
    return finish(cfg, ctx, point, status, message, fields)


def _progress(job_num: int | None) -> str:
    if job_num is None:
        return ""
    total = os.environ.get(SWEEP_TOTAL_ENV)
    return f"[{job_num + 1}/{total}] " if total else f"[{job_num + 1}] "


# ---------------------------------------------------------------- interrupted (Ctrl-C, SIGTERM)

_DIR_OVERRIDES = ("resume=", "+resume=", "++resume=", "hydra.run.dir=", "hydra.sweep.dir=")
_LISTED = 8  # pending sweep points named in the line; the rest are counted


def interrupt_line(signal_name: str, argv: list[str]) -> str:
    """The one line ``python -m cpbench`` prints when a signal ends it: what is on disk (the
    probe points so far, the sweep points without a result) and the command that continues."""
    ctx, sweep = _seen.job, _seen.sweep_points is not None or (_seen.job is not None and _seen.job.multirun)
    head = f"cpbench: interrupted by {signal_name}"
    if sweep:
        sweep_dir = (ctx.sweep_dir if ctx is not None and ctx.sweep_dir is not None else _seen.sweep_dir)
        body = _sweep_progress(ctx, sweep_dir)
        again = _continue_command(argv, "hydra.sweep.dir", sweep_dir)
    elif ctx is None:
        return f"{head} before the job started: nothing measured; run again with: {_continue_command(argv, None, None)}"
    else:
        body = _job_progress(ctx, _seen.routine)
        again = _continue_command(argv, "hydra.run.dir", ctx.out_dir)
    return f"{head}: {body}; continue with: {again}"


def _job_progress(ctx: JobContext, routine: str | None) -> str:
    """What one job left on disk."""
    if (ctx.out_dir / results.RESULT_FILE).exists():
        return f"the job had finished ({ctx.out_dir / results.RESULT_FILE})"
    if routine != "probe":
        return f"the {routine or 'job'} had not finished (no result.json in {ctx.out_dir})"
    state = ctx.out_dir / results.PROBE_STATE_FILE
    try:
        points = results.read_json(state).get("points") or []
    except (OSError, ValueError, AttributeError):
        points = []
    if not points:
        return "no probe point had finished"
    done = ", ".join(f"N={p.get('N')} {'fits' if p.get('fits') else p.get('status')}" for p in points)
    return f"probe points {done} (kept in {state})"


def _sweep_progress(ctx: JobContext | None, sweep_dir: Path | None) -> str:
    """Which sweep points have no result yet (a job that returned, or a result.json in its
    default job directory ``<sweep dir>/<num>``, counts as done)."""
    points = _seen.sweep_points
    total = len(points) if points is not None else int(os.environ.get(SWEEP_TOTAL_ENV) or 0)

    def done(num: int) -> bool:
        return num in _seen.finished or (sweep_dir is not None and (sweep_dir / str(num) / results.RESULT_FILE).exists())

    have = [n for n in range(total) if done(n)]
    running = ctx.job_num if ctx is not None and ctx.job_num is not None and ctx.job_num not in have else None
    pending = [n for n in range(total) if n not in have and n != running]
    slurm = bool(_seen.launcher) and "slurm" in _seen.launcher.lower()

    def name(num: int) -> str:
        """``#3 (cp=4 N=2048)``: the job number and the overrides that tell it from the others."""
        if points is None or num >= len(points):
            return f"#{num}"
        own = " ".join(o for o in points[num] if not all(o in other for other in points))
        return f"#{num} ({own})" if own else f"#{num}"

    parts = [f"{len(have)} of {total} sweep points have their result"]
    if running is not None:
        parts.append(f"interrupted {name(running)}, {_job_progress(ctx, _seen.routine)}")
    if pending:
        listed = ", ".join(name(n) for n in pending[:_LISTED])
        more = f" and {len(pending) - _LISTED} more" if len(pending) > _LISTED else ""
        parts.append(f"{'without a result yet' if slurm else 'not started'} {listed}{more}")
    if slurm:
        parts.append("jobs already submitted to SLURM keep running (scancel them, or continue once they end)")
    return "; ".join(parts)


def _continue_command(argv: list[str], dir_key: str | None, directory: Path | None) -> str:
    """``python -m cpbench <the same arguments> resume=true <dir_key>=<directory>``."""
    args = [a for a in argv if not a.startswith(_DIR_OVERRIDES)]
    if dir_key is not None:
        args.append("resume=true")
        if directory is not None:
            args.append(f"{dir_key}={directory}")
    return " ".join(["python", "-m", "cpbench", *(shlex.quote(a) for a in args)])
