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
      "status": "ok" | "oom" | "timeout" | "error" | "insufficient_gpus",
      "message": "",
      "code": "0.1.0@<commit>",              # code version that entered the signature
      # probe
      "max_n": 12288, "first_fail_n": 12416, "first_fail_status": "oom",
      "first_fail_message": "...", "depth": 2, "depth_verified": true,
      "points": [{"N": 512, "fits": true, "status": "ok", "message": "",
                  "peak_alloc_gib": [..per rank..], "peak_reserved_gib": [..], "seconds": 3.1}],
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
(unused by the probe): the probed sizes are ``points[].N``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

from cpbench.config import mesh_for
from cpbench.memory_model import max_over_ranks

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"
STATUSES = ("ok", "oom", "timeout", "error", "insufficient_gpus")


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


PROBE_STATE_FILE = "probe_state.json"  # written by cpbench.probe after every probe point
INCOMPLETE = "incomplete"


def iter_incomplete_probes(root: str | os.PathLike) -> Iterator[tuple[Path, dict]]:
    """A record per probe stopped before it wrote its result.json (a scheduler's time limit, a
    killed job): ``(path of its probe_state.json, incomplete_probe(...))``, sorted by path."""
    for path in sorted(Path(root).rglob(PROBE_STATE_FILE)):
        if (path.parent / RESULT_FILE).exists():
            continue
        try:
            record = incomplete_probe(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record is not None:
            yield path, record


def without_continued_probes(found: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """``found`` minus each probe record that a later run of the same probe continued: same
    signature, and every point it measured is in the other record, measured the same (a probe
    resumed from a copy of its probe_state.json holds the earlier points). The report then shows
    one row per probe, with its final verdict."""
    def measured(record: dict) -> dict:
        return {p["N"]: (p.get("status"), json.dumps(p.get("peak_alloc_gib"))) for p in record.get("points") or []}

    probes = [(i, rec["signature"], measured(rec)) for i, (_, rec) in enumerate(found)
              if rec.get("routine") == "probe" and rec.get("signature")]
    dropped = set()
    for i, signature, mine in probes:
        for j, other_signature, theirs in probes:
            if (j != i and j not in dropped and other_signature == signature and len(theirs) > len(mine)
                    and all(theirs.get(n) == m for n, m in mine.items())):
                dropped.add(i)
                break
    return [item for i, item in enumerate(found) if i not in dropped]


def incomplete_probe(state_path: Path) -> dict | None:
    """A probe record (status ``incomplete``) from a probe's ``probe_state.json`` and the job's
    ``.hydra/config.yaml`` / ``overrides.yaml``: ``max_n`` is the largest N that fit below the
    smallest failing N (a lower bound of the true max N), ``first_fail_n`` that failing N."""
    import yaml  # omegaconf's dependency

    state = read_json(state_path)
    hydra_dir = state_path.parent / ".hydra"

    def hydra_file(name: str, missing):
        path = hydra_dir / name
        return yaml.safe_load(path.read_text()) if path.exists() else missing

    config, overrides = hydra_file("config.yaml", {}), hydra_file("overrides.yaml", [])
    point = state.get("point") or _point_from_config(config)
    if point is None:
        return None
    points = state.get("points") or []
    fails = sorted(p["N"] for p in points if not p.get("fits"))
    first_fail = fails[0] if fails else None
    fitting = [p for p in points if p.get("fits") and (first_fail is None or p["N"] < first_fail)]
    at_max = max(fitting, key=lambda p: p["N"]) if fitting else None
    fail = next((p for p in points if p["N"] == first_fail), None)
    return {
        "routine": "probe", "status": INCOMPLETE, "point": point, "config": config, "overrides": overrides,
        "message": f"stopped after {len(points)} probe points, before the probe finished: max_n is a lower "
                   "bound (the search had not reached probe.granularity)",
        "max_n": at_max["N"] if at_max else None, "first_fail_n": first_fail,
        "first_fail_status": fail["status"] if fail else None,
        "depth": state.get("depth"), "depth_verified": state.get("depth_verified"), "points": points,
        "peak_alloc_gib": max_over_ranks(at_max["peak_alloc_gib"]) if at_max else None,
        "signature": state.get("signature"), "state_file": state_path.name,
    }


def _point_from_config(config: dict) -> dict | None:
    """The ``point`` block of an older probe_state.json (no ``point`` in it) from the job's
    composed config; None when cp was left to ``auto`` (not knowable after the fact)."""
    cp, topology = config.get("cp"), config.get("topology") or {}
    if not isinstance(cp, int):
        return None
    mesh, _, _ = mesh_for(topology.get("name"), cp, topology.get("cp0"))
    device = config.get("device")
    return {"workflow": (config.get("workflow") or {}).get("name"), "topology": topology.get("name"), "cp": cp,
            "mesh_shape": list(mesh), "N": config.get("N"), "S": config.get("S"), "dtype": config.get("dtype"),
            "device": device if device in ("cuda", "cpu") else None, "model": config.get("model") or {}}


def git_commit(repo_dir: str | os.PathLike | None = None) -> str | None:
    """The project's git commit (``+dirty`` when the tree has changes), or None outside git."""
    cwd = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def code_version() -> str:
    """What identifies the benchmark code for resume: the package version + a hash of its
    Python sources (works where no ``.git`` travels, e.g. a copied tree on a GPU node)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("cpbench")
    except PackageNotFoundError:
        pkg = "0+unknown"
    root = Path(__file__).resolve().parent
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


def base_env_metadata() -> dict[str, Any]:
    """Host and software metadata that needs no GPU query (the GPU part is in ``memory``/NVML)."""
    import torch

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "git_commit": git_commit(),
    }
    if torch.cuda.is_available():
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            env["nccl"] = None
    return env
