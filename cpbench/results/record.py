"""The result record: schema, atomic JSON writing, the point signature for resume.

One ``result.json`` per job (one sweep point), in the job's Hydra output directory; with
``routine=auto`` and an ``N`` in the resolved config also one per configuration, its max-N probe's,
in ``<sweep dir>/probes/<signature>/`` (a single run: ``<run dir>/probes/<signature>/``)::

    {
      "schema": 2,                         # a reader skips a record of another version (one line)
      "signature": "3f2a...",              # hash of the point's config + code version (resume);
                                           # routine=auto's probe: without N and N_atoms
      "point": {"workflow": "inference", "topology": "1d", "cp": 2, "mesh_shape": [2],
                "N": 1024, "N_atoms": 8192, "S": 256, "dtype": "bf16", "device": "cuda",
                "dtype_reason": "cuda",       # why this dtype: dtype=auto's evidence (a CPU's bf16
                                              # units or their absence), or "asked"
                "input": null,              # real inputs: the input file's name
                "model": {"name": "boltz2", "c_s": 384, ...},
                "memory_limit_gib": null,   # memory.limit_gib in effect (auto: a CPU probe 0.0625
                                            # GiB inference, 0.3 training; timings and GPUs none)
                "cuda_alloc_conf": "expandable_segments:True",  # the workers' PYTORCH_CUDA_ALLOC_CONF
                "emulated": false,          # emulate=true: rank 0 of cp=K ran alone on a fake group
                "emulation": {"K": 4, "grid": [2, 2], "comm_reserve_gib": 4.5,  # only when emulated:
                              "comm_reserve_source": "..."}},  # the allowance for NCCL's memory
      "routine": "probe" | "timing",       # as resolved: routine=auto is "timing" when the job's
                                           # resolved config has an N, else "probe"
      "status": "ok" | "oom" | "timeout" | "error" | "insufficient_gpus" | "unstable",
      "message": "",
      "code": "0.1.0+src.1a2b3c4d5e6f",      # package version + hash of cpbench's sources (signature)
      # probe
      "max_n": 12288, "first_fail_n": 12416, "first_fail_status": "oom",
      "first_fail_message": "...", "depth": 2, "depth_verified": true,
      "points": [{"N": 512, "fits": true, "status": "ok", "message": "",
                  "lean": false,             # true: run as run_step(..., lean=True) (below)
                  "peak_alloc_gib": [..per rank..], "peak_reserved_gib": [..], "seconds": 3.1,
                  "step_s": 1.2, "compile_s": 0.4,     # the step and its compiling (slowest
                                                       # rank); absent when a rank did not finish
                  "stage_peak_gib": {"embedding": .., "trunk": ..}}],  # per stage, largest over
                                                       # ranks, where the adapter reports them
      "strategy": "bisect" | "predict",      # probe.strategy as resolved
      "predicted_max_n": 12416,              # predict: where the fitted peak meets the memory; else null
      "prediction": {"capacity_gib": 140.4, "capacity_source": "memory.limit_gib" | "gpu_memory_gib",
                     "fit": {"a": .., "b": .., "c": .., "cp": 2, "form": "a·N²+b·N+c", "n_points": 3,
                             "max_rel_residual": .., "n_min": 512, "n_max": 2048},
                     "bracket": [11136, 13696],   # the first bracket measured around the prediction
                     "error_at_max_n": 0.0104,    # (predicted_max_n - max_n) / max_n
                     "fallback": null},           # why it bisected instead (then no fit / bracket)
                                                  # prediction is null unless strategy is predict
      "verify": {"max_n": {"N": 12288, "fits": true, "status": "ok", "message": "",   # probe.verify:
                           "peak_alloc_gib": [..], "peak_reserved_gib": [..], "seconds": 40.2},
                 "above": {"N": 12416, "fits": false, "status": "oom", ...},  # the re-runs; else null
                 "skipped": "stopped at probe.budget_s=3000"},  # only when the budget left one unrun
      "timed_out_n": [],                     # N that timed out: never first_fail_n; the search stops
      "lower_bound": null,                   # why max_n only bounds the max N from below: "timeout",
                                             # "capped", "no failure", "unstable", "first failure error"
      "advice": "to find a max N pass memory.limit_gib=0.125 (now 0.0625 GiB/rank) or probe.start=16 (now 32) or cp=4",
                                             # only when no N fit: see below
      "auto": {"by": "/.../multirun/2026-11-30/12-00-00/3"},  # routine=auto: the job that ran it
      # timing
      "times_ms": [..], "median_ms": .., "iqr_ms": .., "min_ms": .., "max_ms": ..,
      "times_ms_per_rank": [[..], ..], "warmup_ms": [..],     # raw; times_ms = slowest rank
      "emulation_fill_ms": [..],             # emulated only: per timed repeat, the time the emulation's
                                             # stand-ins for the collectives' writes took (the fills of
                                             # cpbench.harness.emulation and the fake backend's own
                                             # copies), taken out of times_ms
      "seconds": 14.2,                       # the timing run's wall time (workers started and joined)
      "tokens_per_s": .., "stats": {"stage_ms": {..}, ...},   # the adapter's optional stats
                                             # (the reference trunk: "comm_per_block", "comm_step":
                                             # calls and bytes per collective kind, "outputs_finite")
      "comm_model": {"link": {..}, "comm_ms_per_kind": {..},  # with a link and counted collectives:
                     "compute_ms": .., "comm_ms": .., "step_ms_range": [.., ..],  # emulated: the
                     "dominant": "compute" | "communication",  # predicted step (no overlap, full)
                     "measured_ms": ..},         # a real run: its measured step instead of the range
      "loss": 1.23,                          # training: the global loss of the last step
      "energy_j_per_step_per_rank": [..],    # NVML's energy counter per step, where the GPU has one
      "partial": {"warmup_ms": [..], "times_ms": [..], "stats": {..}},  # not ok: the steps rank 0 finished
      "profile_traces": ["trace_rank0.json", ..],             # with profile=true
      "memory_breakdown": {"rank": 0, "peak_gib": .., "step_gib": .., "events": ..,  # memory.breakdown=true:
                           "held_gib": {"parameters": .., "gradients": .., "optimizer_state": ..,
                                        "inputs": .., "other_held": ..},  # other_held: CUDA only
                           "sites": [{"site": "cpbench/models/... forward", "gib": .., "blocks": ..}],
                           "sites_by": "function" | "op",  # memory.breakdown_sites
                           "other_sites_gib": .., "unseen_frees_gib": ..,  # blocks left out: freed on a
                                             # backend's thread, which the profiler does not follow
                           "allocator_peak_gib": .., "allocator_start_gib": ..},
                                             # what the rank with the highest peak keeps at the peak of
                                             # one more step, untimed (cpbench.harness.breakdown; the
                                             # allocator_* keys on CUDA only); {"rank", "error"} where
                                             # it could not be taken
      "probe": {"signature": "9c1e...", "path": "<sweep dir>/probes/9c1e.../result.json",
                "ran_here": true, "state": "done" | "run by another job",
                "status": "ok", "max_n": 12288},  # routine=auto: its configuration's probe (below)
      # both routines (probe: at max_n)
      "peak_alloc_gib": .., "peak_reserved_gib": ..,          # max over ranks
      "peak_alloc_gib_per_rank": [..], "peak_reserved_gib_per_rank": [..],
      "memory_measure": "cuda_allocator" | "cpu_peak_rss_above_baseline",
      "notes": ["..."],                      # optional: what the harness chose for the user
      # rows the SLURM controller writes for a job that ended without one (cpbench.sweep.collect)
      "slurm": {"job_id": "123_4", "state": "TIMEOUT", "reason": .., "exit_code": .., "node_list": ..,
                "stdout": "...", "stderr": "..."},
      "seconds_total": 81.2, "overrides": ["cp=2", ...],      # job wall time, command-line overrides
      "env": {...},                          # env_metadata()
      "config": {...}                        # the resolved Hydra config
    }

Probe-only and timing-only keys are present only for their routine. Readers take schema 2
only (``schema_error``); the committed records were migrated once from schema 1, which could
lack keys added later (``docs/results.md``, "Records migrated from version 1": there a
``first_fail_n`` may be a timeout and ``env.tuning_env`` null). ``depth`` is the number
of trunk blocks a probe step ran (the model's ``blocks`` at full depth); ``depth_verified``
is true/false when a shortened depth was checked against the full step at the first point,
null when no shortening was tried. In a probe record, ``point.N`` is the config's ``N``
(unused by the probe): the probed sizes are ``points[].N``. A probe whose verification saw a
point fit once and fail once (or fail once and fit once) has status ``unstable`` and its
message names that N and both outcomes; its ``max_n`` is not a reproducible limit.

``points[].lean`` is true for the points the ``predict`` strategy runs as
``run_step(..., lean=True)`` (its first ramp points, when the adapter's ``run_step`` takes
``lean``: the adapter's irreducible memory, which the fit extrapolates); every other point is
false. ``verify`` is null when ``probe.verify`` is off or no N fit; an entry is null when there
is no such N or it did not run; ``skipped`` is there only when ``probe.budget_s`` stopped a
re-run from starting (the message says so too). ``advice`` is there only when no N fit
(``max_n`` null), unless every failure was a timeout (status ``timeout``): what to pass to find
a max N (twice the ``memory.limit_gib`` when a cap is set, ``probe.start`` at half the smallest
N tried rounded down to the padding unit when that is at least one unit, twice the ``cp``),
also written into ``message``; null unless the smallest N tried ran out of memory.

``routine=auto``: a job whose resolved config has an ``N`` (the command line, a sweep or an
experiment file) times its point, and its configuration (the
point without ``N`` and ``N_atoms``) gets one max-N probe: the first job to create
``<sweep dir>/probes/<signature>.lock`` runs it and writes
``<sweep dir>/probes/<signature>/result.json`` (an ordinary probe record plus ``auto``: its
``point.N`` and ``config`` are that job's, ``overrides`` that job's without ``N`` and
``N_atoms``, ``seconds_total`` the probe's own).
The timing record's ``probe`` names it: ``signature`` and ``path``; ``ran_here`` (this job ran
it); ``state`` ``"done"`` (it is on disk) or ``"run by another job"`` (another job holds the
lock: that job writes it, this one did not wait); ``status`` and ``max_n`` only when
``ran_here``; the timing job's ``seconds_total`` then includes the probe.

An ``insufficient_gpus`` row is a point on ``cuda`` that needs more GPUs than are visible,
under the local launcher in a multirun (a single run stops with the same line, exit code 2;
under SLURM each job gets the GPUs its cp needs): no routine fields, no probe, and a
``message`` that names the GPUs it needs and the command that runs it
(``cp=4 needs 4 GPUs, 2 visible here; run it with: python -m cpbench -m hydra/launcher=slurm
<its overrides>``). A row the SLURM controller writes (``slurm``; for an sbatch refusal
``{"job_id": null, "state": "REFUSED", "reason": ...}``) has a null signature and, for a probe,
what its ``probe_state.json`` held (``points``, ``max_n``, ``first_fail_n``, ``timed_out_n``,
``depth``). A multirun job whose config fails to resolve is an ``error`` row with ``point`` null
and ``routine`` as configured.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

SCHEMA_VERSION = 2  # 2: every key below that the writer always writes is present (1 could lack some)
RESULT_FILE = "result.json"
STATUSES = ("ok", "oom", "timeout", "error", "insufficient_gpus", "unstable")


def write_json_atomic(path: str | os.PathLike, record: dict) -> Path:
    """Write ``record`` as JSON to ``path`` through a temp file + rename (never a torn file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


def iter_results(root: str | os.PathLike) -> Iterator[tuple[Path, dict]]:
    """Every readable ``result.json`` under ``root`` at ``SCHEMA_VERSION`` (sorted by path);
    unreadable ones and records of another version skipped (``schema_error`` says why)."""
    for path in sorted(Path(root).rglob(RESULT_FILE)):
        try:
            record = read_json(path)
        except (OSError, json.JSONDecodeError):
            continue
        if schema_error(record) is None:
            yield path, record


def schema_error(record) -> str | None:
    """Why ``record`` is not read, in one line: a JSON object whose ``schema`` is not
    ``SCHEMA_VERSION`` (None: it is, or it is no object, which the readers report themselves)."""
    if not isinstance(record, dict) or record.get("schema") == SCHEMA_VERSION:
        return None
    return (f"result schema {record.get('schema')!r}, this cpbench reads schema {SCHEMA_VERSION} only "
            "(docs/results.md: the schema)")


def find_previous(signature: str, out_dir: Path, sweep_dir: Path | None) -> tuple[Path, dict] | None:
    """A result.json with ``signature`` in ``out_dir``, else anywhere under ``sweep_dir``."""
    own = out_dir / RESULT_FILE
    if own.exists():
        try:
            record = read_json(own)
            if record.get("signature") == signature and schema_error(record) is None:
                return own, record
        except (OSError, ValueError):
            pass
    if sweep_dir is not None and sweep_dir.exists():
        for path, record in iter_results(sweep_dir):
            if record.get("signature") == signature:
                return path, record
    return None


def code_version() -> str:
    """What identifies the benchmark code for resume: the package version + a hash of its
    Python sources (works where no ``.git`` travels, e.g. a copied tree on a GPU node)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("cpbench")
    except PackageNotFoundError:
        pkg = "0+unknown"
    root = Path(__file__).resolve().parent.parent  # the cpbench package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{pkg}+src.{digest.hexdigest()[:12]}"


def point_signature(point_config: dict, code: str | None = None) -> str:
    """Stable hash of everything that decides a point's outcome (config + code version).

    ``point_config`` is the resolved config minus keys that do not change the measurement
    (``resume``, ``report``, ``hydra``); see ``config.signature_config``.
    """
    payload = json.dumps({"config": point_config, "code": code if code is not None else code_version()},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def max_over_ranks(value) -> float | None:
    """Max over ranks of a per-rank list (or a scalar); None when nothing was measured."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        values = [float(v) for v in value if v is not None]
        return max(values) if values else None
    return float(value)
