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
    return {
        "routine": "probe", "status": INCOMPLETE, "point": point, "config": config, "overrides": overrides,
        "message": f"stopped after {len(points)} probe points, before the probe finished: max_n is a lower "
                   "bound (the search had not reached probe.granularity)",
        "max_n": at_max["N"] if at_max else None, "first_fail_n": first_fail,
        "first_fail_status": fail["status"] if fail else None, "timed_out_n": timed_out,
        "depth": state.get("depth"), "depth_verified": state.get("depth_verified"), "points": points,
        "peak_alloc_gib": max_over_ranks(at_max["peak_alloc_gib"]) if at_max else None,
        "signature": state.get("signature"), "state_file": state_path.name,
    }


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
