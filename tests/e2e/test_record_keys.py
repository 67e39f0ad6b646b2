"""The schema in ``cpbench/results/record.py``'s docstring names every key of the records a real
run writes: ``python -m cpbench`` with ``routine=auto`` at one N (the default routine) on the CPU
writes a timing record and its configuration's probe record (``probes/<signature>/``, with
``auto``), the timing with ``memory.breakdown=true``; about 6 s on 2 cores (the fault adapter: no
step takes time)."""

from __future__ import annotations

import json
import re

from cpbench.results import record

from helpers.run import fault_model, run_cpbench


def test_the_schema_names_every_key_of_a_routine_auto_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cpbench(["device=cpu", "cp=2", "N=16", *fault_model("oom", 48), "probe.start=16", "probe.granularity=16",
                        "memory.breakdown=true", f"hydra.run.dir={run_dir}", "report.out=null"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    timing = json.loads((run_dir / "result.json").read_text())
    (probe_path,) = (run_dir / "probes").glob("*/result.json")
    probe = json.loads(probe_path.read_text())
    assert timing["routine"] == "timing" and probe["routine"] == "probe" and probe["max_n"] == 48

    documented = set(re.findall(r'"(\w+)":', record.__doc__))  # as tests/unit/test_result_schema.py
    for rec in (probe, timing):
        assert sorted(set(rec) - documented) == [], rec["routine"]
    assert sorted({k for p in probe["points"] for k in p} - documented) == []
    breakdown = timing["memory_breakdown"]
    assert "error" not in breakdown, breakdown
    assert sorted(set(breakdown) - documented) == [] and sorted(set(breakdown["held_gib"]) - documented) == []
    assert sorted({k for s in breakdown["sites"] for k in s} - documented) == []
    assert sorted(set(probe["point"]) - documented) == []
    assert sorted(set(probe["auto"]) - documented) == [] and sorted(set(timing["probe"]) - documented) == []
    assert timing["probe"]["ran_here"] and timing["probe"]["path"] == str(probe_path)
