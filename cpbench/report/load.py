"""The records under a directory, as the report and ``cpbench.estimate`` read them.

Every ``result.json`` under the directory, plus a record for each probe stopped before its
result.json (``results.iter_incomplete_probes``), less the probes a later run continued
(``results.without_continued_probes``). A file that cannot be read (not JSON, not an object), a
record of another schema version than ``results.SCHEMA_VERSION`` (``results.schema_error``) or one
whose record the report cannot make rows of (a field of the wrong type) is skipped with one
warning line naming it (``logging``: stderr from the command line, the job's log under Hydra),
never a traceback; the report of the others is still built.

Example::

    found = load_records("outputs/multirun/2026-11-30/12-00-00")  # [(path, record), ...]
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cpbench.report.rows import probe_point_rows, result_rows
from cpbench.results import (
    PROBE_STATE_FILE,
    RESULT_FILE,
    incomplete_probe,
    iter_incomplete_probes,
    iter_results,
    read_json,
    schema_error,
    without_continued_probes,
)

log = logging.getLogger(__name__)

_NUMBER = (int, float)
# Fields the report sorts, groups or computes on across records, and their types (None is allowed):
# a wrong type here passes the one record's rows and breaks the whole table later.
FIELD_TYPES: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("routine", str), ("status", str), ("message", str), ("max_n", int), ("first_fail_n", int),
    ("first_fail_status", str), ("median_ms", _NUMBER), ("signature", str),
    ("point.workflow", str), ("point.topology", str), ("point.dtype", str), ("point.device", str),
    ("point.N", int), ("point.N_atoms", int), ("point.S", int), ("point.cp", int),
    ("env.date", str), ("env.gpu_model", str), ("env.gpu_memory_gib", _NUMBER),
)
POINT_FIELD_TYPES = (("N", int), ("status", str), ("seconds", _NUMBER))  # per entry of a probe's points[]


def load_records(root: str | os.PathLike) -> list[tuple[Path, dict]]:
    """``(path, record)`` of every readable record under ``root``, sorted by path (result.json
    files, then the stopped probes' probe_state.json); each skipped file logged as one line."""
    root = Path(root)
    found = list(iter_results(root)) + list(iter_incomplete_probes(root))
    for path in _unread(root, {path for path, _ in found}):
        log.warning("skipped %s: %s", path, _read_error(path))
    readable = []
    for path, record in found:
        problem = _field_error(record)
        if problem:
            log.warning("skipped %s: %s", path, problem)
        else:
            readable.append((path, record))
    if _row_error(readable, root):  # rare: then find the records at fault, one at a time
        readable = [item for item in readable if not _skipped_for_rows(item, root)]
    return without_continued_probes(_with_hardware(readable, root))


def _with_hardware(found: list[tuple[Path, dict]], root: Path) -> list[tuple[Path, dict]]:
    """``found``, where a stopped probe's state predates its ``env`` (what it ran on) and sits in a
    folder below ``root`` whose other records all name one GPU model: that model, marked
    ``env.gpu_model_from: "neighbours"`` (one campaign call runs on one machine). Else unchanged:
    the report then keeps such a record apart from every named GPU's figures."""
    named = [(path.parent, rec["env"]["gpu_model"]) for path, rec in found if (rec.get("env") or {}).get("gpu_model")]
    out = []
    for path, rec in found:
        env = rec.get("env") or {}
        if env.get("gpu_model") or not rec.get("state_file") or (rec.get("point") or {}).get("device") == "cpu":
            out.append((path, rec))
            continue
        models: set[str] = set()
        for folder in path.parents:
            if folder == root or not folder.is_relative_to(root):
                break
            models = {model for where, model in named if where.is_relative_to(folder)}
            if models:
                break
        if len(models) == 1:
            rec = {**rec, "env": {**env, "device": env.get("device") or "cuda", "gpu_model": models.pop(),
                                  "gpu_model_from": "neighbours"}}
        out.append((path, rec))
    return out


def _skipped_for_rows(item: tuple[Path, dict], root: Path) -> bool:
    problem = _row_error([item], root)
    if problem:
        log.warning("skipped %s: %s", item[0], problem)
    return problem is not None


def _unread(root: Path, read: set[Path]) -> list[Path]:
    """The record files under ``root`` the readers of ``results`` passed over."""
    results = [p for p in sorted(root.rglob(RESULT_FILE)) if p not in read]
    states = [p for p in sorted(root.rglob(PROBE_STATE_FILE))
              if p not in read and not (p.parent / RESULT_FILE).exists()]
    return results + [p for p in states if _read_error(p)]  # a state without a point is no record, not an error


def _read_error(path: Path) -> str | None:
    """Why ``path`` gives no record, in one line (None: it reads)."""
    try:
        if path.name == PROBE_STATE_FILE:
            incomplete_probe(path)
        elif problem := schema_error(read_json(path)):
            return problem
    except Exception as exc:  # noqa: BLE001 - any reader failure is one line naming the file
        return _one_line(exc)
    return None


def _row_error(found: list[tuple[Path, dict]], root: Path) -> str | None:
    """Why the report cannot make rows of ``found`` (one line), or None."""
    try:
        result_rows(found, root)
        probe_point_rows(found)
        without_continued_probes(found)
    except Exception as exc:  # noqa: BLE001 - a malformed record is skipped with one line, never a traceback
        return _one_line(exc)
    return None


def _field_error(record) -> str | None:
    """Why ``record`` is not one: not a JSON object, or the first field of ``FIELD_TYPES`` (or of
    a probe point) with a value of another type."""
    if not isinstance(record, dict):
        return f"not a JSON object ({type(record).__name__})"
    def wrong(value, types, name: str) -> str | None:
        if value is None or isinstance(value, types):
            return None
        allowed = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        return f"{name} is {value!r:.40} ({type(value).__name__}), not {allowed}"

    for name, types in FIELD_TYPES:
        value = record
        for key in name.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if problem := wrong(value, types, name):
            return problem
    points = record.get("points")
    for i, point in enumerate(points if isinstance(points, list) else []):
        for key, types in POINT_FIELD_TYPES:
            if problem := wrong(point.get(key) if isinstance(point, dict) else None, types, f"points[{i}].{key}"):
                return problem
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
