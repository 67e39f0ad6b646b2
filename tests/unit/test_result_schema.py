"""The schema in ``cpbench/results/record.py``'s docstring names every key the probe writes:
its top-level keys and those of ``points[]``, ``prediction`` (with its ``fit``), ``verify`` (with
``skipped``) and ``advice``, from the probe's own code over a rule runner (no worker processes).
``tests/e2e/test_record_keys.py`` checks the records of a real run against the same list."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

from cpbench.harness.runner import PointResult
from cpbench.harness.slots import Slots, SupervisorGroup
from cpbench.results import record
from cpbench.routines.probe import Probe

from helpers.run import compose_point


def documented_keys() -> set[str]:
    """Every ``"key":`` in the schema of ``record.py``'s docstring."""
    return set(re.findall(r'"(\w+)":', record.__doc__))


class LinearRunner:
    """Peak N/1000 GiB on both ranks; ``oom`` above ``max_fit_n``."""

    def __init__(self, max_fit_n: int):
        self.max_fit_n = max_fit_n
        self.group = SupervisorGroup(Slots("local", 2, 0, 1, (0, 1), (0, 0)))

    def run(self, task) -> PointResult:
        if task.N > self.max_fit_n:
            return PointResult("oom", "rank 1: out of memory", [{"rank": r, "status": "oom"} for r in (0, 1)], 1.0)
        peak = task.N / 1000
        ranks = [{"rank": r, "status": "ok", "peak_alloc_gib": peak, "peak_reserved_gib": peak} for r in (0, 1)]
        return PointResult("ok", "", ranks, 1.0)


def probe_point(**probe):
    point = compose_point("device=cpu", "model=tiny", "cp=2")  # a CPU probe: memory.limit_gib 0.0625
    return replace(point, probe=replace(point.probe, **{"depth": None, "granularity": 64, **probe}))


def missing(keys, documented: set[str]) -> list[str]:
    return sorted(set(keys) - documented)


def test_the_schema_names_every_key_of_a_predicted_verified_probe(tmp_path):
    documented = documented_keys()
    point = probe_point(strategy="predict", verify=True, start=8, granularity=8)
    out = Probe(point, LinearRunner(max_fit_n=100), tmp_path / "state.json", "sig", lean_fit=True).run()
    assert out["prediction"]["fit"] is not None and out["verify"]["above"] is not None, out
    assert any(p["lean"] for p in out["points"])
    assert missing(out, documented) == []
    assert missing(out["prediction"], documented) == missing(out["prediction"]["fit"], documented) == []
    assert missing(out["verify"], documented) == missing(out["verify"]["max_n"], documented) == []
    assert missing((k for p in out["points"] for k in p), documented) == []

    # a probe continued from its state with no time left: its re-runs are skipped
    state = tmp_path / "bisect.json"
    Probe(probe_point(verify=False), LinearRunner(max_fit_n=96), state, "sig").run()
    again = Probe(probe_point(verify=True, budget_s=0.0), LinearRunner(max_fit_n=96), state, "sig").run()
    assert "skipped" in again["verify"] and missing(again["verify"], documented) == []


def test_the_schema_names_the_advice_of_a_probe_where_no_n_fits():
    out = Probe(probe_point(start=32), LinearRunner(max_fit_n=16), None, "sig").run()
    assert out["max_n"] is None and out["advice"]
    assert missing(out, documented_keys()) == []


# ---------------------------------------------------------------------------------------------
# The version: every committed record is at it; a record of another version is one line
# ---------------------------------------------------------------------------------------------

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def test_every_committed_record_is_at_the_current_schema_and_loads(caplog):
    from cpbench.report.load import load_records
    from cpbench.results import SCHEMA_VERSION, iter_results

    paths = sorted(COMMITTED.rglob("result.json"))
    assert len(paths) > 100
    old = [str(p) for p in paths if json.loads(p.read_text()).get("schema") != SCHEMA_VERSION]
    assert not old, old
    assert [p for p, _ in iter_results(COMMITTED)] == paths
    with caplog.at_level(logging.WARNING):
        load_records(COMMITTED)
    assert not [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]


def test_a_record_of_an_old_schema_is_skipped_with_one_line_naming_it(tmp_path, caplog):
    from cpbench.report.load import load_records
    from cpbench.results import SCHEMA_VERSION, find_previous

    source = next(p for p in sorted(COMMITTED.rglob("result.json")) if json.loads(p.read_text())["routine"] == "timing")
    record = json.loads(source.read_text())
    for name, version in (("current", SCHEMA_VERSION), ("old", 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps({**record, "schema": version}))
    with caplog.at_level(logging.WARNING):
        found = load_records(tmp_path)
    assert [p.parent.name for p, _ in found] == ["current"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert str(tmp_path / "old" / "result.json") in lines[0]
    assert f"schema 1, this cpbench reads schema {SCHEMA_VERSION} only" in lines[0]
    # resume never takes an old record for a point's own
    assert find_previous(record["signature"], tmp_path / "old", None) is None
