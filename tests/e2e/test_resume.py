"""``resume=true`` runs only the points whose result.json is missing (signature match)."""

from __future__ import annotations

from cpbench.results import read_json

from helpers.run import fault_model, run_cpbench


def test_resume_runs_only_the_missing_point(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "device=cpu", "cp=1", "routine=timing", "N=32,48", *fault_model("none"),
            f"hydra.sweep.dir={sweep}", "report.out=null"]
    first = run_cpbench(args, cwd=tmp_path, timeout_s=180)
    assert first.returncode == 0, first.stderr[-3000:]
    results = sorted(sweep.glob("*/result.json"))
    assert len(results) == 2
    kept = {p: p.stat().st_mtime_ns for p in results}
    missing = sweep / "1" / "result.json"
    missing.unlink()

    again = run_cpbench([*args, "resume=true"], cwd=tmp_path, timeout_s=180)
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_json(missing)["status"] == "ok" and read_json(missing)["point"]["N"] == 48
    for path, mtime in kept.items():
        if path != missing:
            assert path.stat().st_mtime_ns == mtime  # not re-run, not rewritten
    assert (again.stdout + again.stderr).count("already has this point") == 1


def test_changed_point_is_not_resumed(tmp_path):
    sweep = tmp_path / "sweep"
    base = ["device=cpu", "cp=1", "routine=timing", "N=32", *fault_model("none"), f"hydra.run.dir={sweep}"]
    assert run_cpbench(base, cwd=tmp_path, timeout_s=120).returncode == 0
    signature = read_json(sweep / "result.json")["signature"]
    proc = run_cpbench([*base, "resume=true", "timing.repeats=6"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_json(sweep / "result.json")
    assert record["signature"] != signature and len(record["times_ms"]) == 6
