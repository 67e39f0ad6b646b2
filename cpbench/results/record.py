"""The result record: schema, atomic JSON writing, the point signature for resume.

One ``result.json`` per job (one sweep point), in the job's Hydra output directory::

    {
      "schema": 1,
      "signature": "3f2a...",              # hash of the point's config + code version (resume)
      "point": {"workflow": "inference", "topology": "1d", "cp": 2, "mesh_shape": [2],
                "N": 1024, "N_atoms": 8192, "S": 256, "dtype": "bf16", "device": "cuda",
                "input": null,              # real inputs: the input file's name
                "model": {"name": "boltz2", "c_s": 384, ...},
                "memory_limit_gib": null},  # memory.limit_gib in effect (CPU: 0.125 by default)
      "routine": "probe" | "timing",
      "status": "ok" | "oom" | "timeout" | "error" | "insufficient_gpus" | "unstable",
      "message": "",
      "code": "0.1.0@<commit>",              # code version that entered the signature
      # probe
      "max_n": 12288, "first_fail_n": 12416, "first_fail_status": "oom",
      "first_fail_message": "...", "depth": 2, "depth_verified": true,
      "points": [{"N": 512, "fits": true, "status": "ok", "message": "",
                  "peak_alloc_gib": [..per rank..], "peak_reserved_gib": [..], "seconds": 3.1}],
      "strategy": "bisect" | "predict",      # probe.strategy as resolved
      "predicted_max_n": 12416,              # predict: where the fitted peak meets the memory; else null
      "prediction": {"capacity_gib": 140.4, "capacity_source": "memory.limit_gib" | "gpu_memory_gib",
                     "fit": {"a": .., "b": .., "c": .., "cp": 2, "form": "a·N²+b·N+c", "n_points": 3,
                             "max_rel_residual": .., "n_min": 512, "n_max": 2048},
                     "bracket": [11136, 13696],   # the first bracket measured around the prediction
                     "error_at_max_n": 0.0104,    # (predicted_max_n - max_n) / max_n
                     "fallback": null},           # why it bisected instead (then no fit / bracket)
      "verify": {"max_n": {"N": 12288, "fits": true, "status": "ok", ...},      # probe.verify: the
                 "above": {"N": 12416, "fits": false, "status": "oom", ...}},  # re-runs; else null
      "timed_out_n": [],                     # N that timed out: never first_fail_n; the search stops
      "lower_bound": null,                   # why max_n only bounds the max N from below: "timeout",
                                             # "capped", "no failure", "unstable", "first failure error"
      # timing
      "times_ms": [..], "median_ms": .., "iqr_ms": .., "min_ms": .., "max_ms": ..,
      "times_ms_per_rank": [[..], ..], "warmup_ms": [..],     # raw; times_ms = slowest rank
      "tokens_per_s": .., "stats": {"stage_ms": {..}, ...},   # the adapter's optional stats
      "loss": 1.23,                          # training: the global loss of the last step
      "profile_traces": ["trace_rank0.json", ..],             # with profile=true
      # both routines (probe: at max_n)
      "peak_alloc_gib": .., "peak_reserved_gib": ..,          # max over ranks
      "peak_alloc_gib_per_rank": [..], "peak_reserved_gib_per_rank": [..],
      "memory_measure": "cuda_allocator" | "cpu_peak_rss_above_baseline",
      "notes": ["..."],                      # optional: what the harness chose for the user
      "seconds_total": 81.2, "overrides": ["cp=2", ...],      # job wall time, command-line overrides
      "env": {...},                          # env_metadata()
      "config": {...}                        # the resolved Hydra config
    }

Probe-only and timing-only keys are present only for their routine. ``depth`` is the number
of trunk blocks a probe step ran (the model's ``blocks`` at full depth); ``depth_verified``
is true/false when a shortened depth was checked against the full step at the first point,
null when no shortening was tried. In a probe record, ``point.N`` is the config's ``N``
(unused by the probe): the probed sizes are ``points[].N``. A probe whose verification saw a
point fit once and fail once (or fail once and fit once) has status ``unstable`` and its
message names that N and both outcomes; its ``max_n`` is not a reproducible limit.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

SCHEMA_VERSION = 1
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
    """Every readable ``result.json`` under ``root`` (sorted by path); unreadable ones skipped."""
    for path in sorted(Path(root).rglob(RESULT_FILE)):
        try:
            yield path, read_json(path)
        except (OSError, json.JSONDecodeError):
            continue


def find_previous(signature: str, out_dir: Path, sweep_dir: Path | None) -> tuple[Path, dict] | None:
    """A result.json with ``signature`` in ``out_dir``, else anywhere under ``sweep_dir``."""
    own = out_dir / RESULT_FILE
    if own.exists():
        try:
            record = read_json(own)
            if record.get("signature") == signature:
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
