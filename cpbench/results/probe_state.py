"""A probe's state on disk (``probe_state.json``) and what the report reads of it.

The probe (``cpbench.routines.probe``) writes ``probe_state.json`` atomically after every point
(signature, depth, every measured point, the point block); a restarted job with the same
signature replays it. A probe stopped before its ``result.json`` (a time limit, a killed job)
becomes an ``incomplete`` record here, whose ``max_n`` is a lower bound.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from cpbench.results.record import RESULT_FILE, max_over_ranks, read_json

PROBE_STATE_FILE = "probe_state.json"  # written by cpbench.routines.probe after every probe point
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
    signature, every point it measured is in the other record, measured the same (N, status,
    peaks and seconds: a probe resumed from a copy of its probe_state.json holds the earlier
    points as they were; a run of its own measures at least its seconds anew), and the other
    record went further: more points, or the same points and more of the bracket's re-runs
    (``probe.verify``; a job stopped during them and resumed). The report then shows one row
    per probe, with its final verdict."""
    def measured(record: dict) -> dict:
        return {p["N"]: (p.get("status"), json.dumps(p.get("peak_alloc_gib")), p.get("seconds"))
                for p in record.get("points") or []}

    def progress(record: dict) -> tuple[int, int]:
        verify = record.get("verify") or {}
        return len(record.get("points") or []), sum(bool(verify.get(key)) for key in ("max_n", "above"))

    probes = [(i, _state_signature(path, rec), measured(rec), progress(rec)) for i, (path, rec) in enumerate(found)
              if rec.get("routine") == "probe" and rec.get("signature")]
    dropped = set()
    for i, signature, mine, my_progress in probes:
        for j, other_signature, theirs, their_progress in probes:
            if (j != i and j not in dropped and other_signature == signature and their_progress > my_progress
                    and all(theirs.get(n) == m for n, m in mine.items())):
                dropped.add(i)
                break
    return [item for i, item in enumerate(found) if i not in dropped]


def _state_signature(path: Path, record: dict) -> str:
    """The signature of a probe record's saved points: an incomplete record's own (read from its
    probe_state.json), a result.json's from the probe_state.json beside it (a result's signature
    covers the probe's limits too, which a resumed probe may have changed), else the result's."""
    if record.get("state_file"):
        return record["signature"]
    try:
        return read_json(Path(path).parent / PROBE_STATE_FILE)["signature"]
    except (OSError, ValueError, KeyError, TypeError):
        return record["signature"]


def incomplete_probe(state_path: Path) -> dict | None:
    """A probe record (status ``incomplete``) from a probe's ``probe_state.json`` and the job's
    ``.hydra/config.yaml`` / ``overrides.yaml``: ``max_n`` is the largest N that fit below the
    smallest failing N (a lower bound of the true max N), ``first_fail_n`` that failing N. A point
    that timed out bounds nothing (as in the probe): it is in ``timed_out_n``, never ``first_fail_n``."""
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
    fails = sorted(p["N"] for p in points if not p.get("fits") and p.get("status") != "timeout")
    timed_out = sorted(p["N"] for p in points if p.get("status") == "timeout")
    first_fail = fails[0] if fails else None
    fitting = [p for p in points if p.get("fits") and (first_fail is None or p["N"] < first_fail)]
    at_max = max(fitting, key=lambda p: p["N"]) if fitting else None
    fail = next((p for p in points if p["N"] == first_fail), None)
    status, message, verify = INCOMPLETE, (
        f"stopped after {len(points)} probe points, before the probe finished: max_n is a lower "
        "bound (the search had not reached probe.granularity)"), None
    granularity = _granularity(state, config)
    if (at_max is not None and fail is not None and fail["status"] == "oom" and granularity is not None
            and first_fail - at_max["N"] <= granularity and not any(at_max["N"] < n < first_fail for n in timed_out)):
        # the bisection had ended: the job stopped while re-running the bracket's ends (probe.verify)
        status, message, verify = _interrupted_verification(state.get("verify") or {}, at_max["N"], first_fail,
                                                             granularity)
    return {
        "routine": "probe", "status": status, "point": point, "config": config, "overrides": overrides,
        "message": message, "verify": verify,
        # why max_n only bounds the max N from below (report.rows.lower_bound_reason): a stopped
        # search is capped; a finished bisection's out-of-memory bounds it from above
        "lower_bound": {"ok": None, "unstable": "unstable"}.get(status, "capped"),
        "max_n": at_max["N"] if at_max else None, "first_fail_n": first_fail,
        "first_fail_status": fail["status"] if fail else None, "timed_out_n": timed_out,
        "depth": state.get("depth"), "depth_verified": state.get("depth_verified"), "points": points,
        # what it ran on, and the GPU memory the predict strategy used (report.memory_table.capacity_gib reads env)
        "env": {**(state.get("env") or {}), **_capacity_env(state.get("capacity"), point)},
        "peak_alloc_gib": max_over_ranks(at_max["peak_alloc_gib"]) if at_max else None,
        "signature": state.get("signature"), "state_file": state_path.name,
    }


def _capacity_env(capacity: dict | None, point: dict) -> dict:
    """``{"device", "gpu_memory_gib"}`` when the state recorded the GPU's memory, else {} (a
    ``memory.limit_gib`` cap is in the point already)."""
    if not capacity or capacity.get("source") != "gpu_memory_gib" or not capacity.get("gib"):
        return {}
    return {"device": point.get("device"), "gpu_memory_gib": capacity["gib"]}


def _granularity(state: dict, config: dict) -> int | None:
    """The granularity the probe bisected to: its state's (resolved, in padding units), else an
    integer ``probe.granularity`` of the job's config; None for an older state of an ``auto``
    granularity (the default it resolved to then need not be today's)."""
    for value in (state.get("granularity"), (config.get("probe") or {}).get("granularity")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _interrupted_verification(verify: dict, max_n: int, first_fail_n: int, granularity: int) -> tuple[str, str, dict]:
    """``(status, message, verify)`` of a probe whose bisection had ended (max N, then an
    out-of-memory within ``granularity``) when the job stopped during its re-runs: ``ok`` (the
    bracket stands; the re-runs done agreed), or ``unstable`` when a re-run done disagreed."""
    done = {key: verify[key] for key in ("max_n", "above") if verify.get(key)
            and verify[key].get("N") == (max_n if key == "max_n" else first_fail_n)}
    flipped = [key for key, again in done.items() if again.get("status") != "timeout"
               and again.get("fits") != (key == "max_n")]
    said = [f"N={again['N']} {'fits' if again.get('fits') else again.get('status')}" for again in done.values()]
    missing = [str(n) for key, n in (("max_n", max_n), ("above", first_fail_n)) if key not in done]
    message = (f"the bisection had ended (max N {max_n}, out of memory at {first_fail_n}, within "
               f"probe.granularity={granularity}) when the job stopped during the re-runs of the bracket's ends "
               f"(probe.verify): re-run {', '.join(said) or 'none'}; not re-run: N={', '.join(missing) or 'none'}")
    out = {**done, "skipped": f"the job stopped before re-running N={', '.join(missing)}" if missing else None}
    return ("unstable" if flipped else "ok"), message, out


def _point_from_config(config: dict) -> dict | None:
    """The ``point`` block of an older probe_state.json (no ``point`` in it) from the job's
    composed config; None when cp was left to ``auto`` (not knowable after the fact)."""
    from cpbench.config import mesh_for  # here: omegaconf and the input readers cost a worker 0.3 s

    cp, topology = config.get("cp"), config.get("topology") or {}
    if not isinstance(cp, int):
        return None
    mesh, _, _ = mesh_for(topology.get("name"), cp, topology.get("cp0"))
    device = config.get("device")
    return {"workflow": (config.get("workflow") or {}).get("name"), "topology": topology.get("name"), "cp": cp,
            "mesh_shape": list(mesh), "N": config.get("N"), "S": config.get("S"), "dtype": config.get("dtype"),
            "device": device if device in ("cuda", "cpu") else None, "model": config.get("model") or {}}
