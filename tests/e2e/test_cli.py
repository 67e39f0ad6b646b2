"""``python -m cpbench`` end to end: multiruns leave a row per point, failures included."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pandas as pd
import pytest

from cpbench.results import iter_results

from helpers.run import REPO_ROOT, fault_model, run_cpbench

HAS_REPORT = importlib.util.find_spec("cpbench.report") is not None


def test_timing_multirun_of_the_reference_trunk_leaves_8_ok_results(timing_multirun):
    records = [r for _, r in iter_results(timing_multirun)]
    assert len(records) == 8
    assert all(r["status"] == "ok" for r in records), [(r["point"], r["message"]) for r in records]
    points = {(r["point"]["workflow"], r["point"]["cp"], r["point"]["N"]) for r in records}
    assert points == {(w, cp, n) for w in ("inference", "training") for cp in (1, 2) for n in (16, 32)}
    assert all(r["median_ms"] > 0 and len(r["times_ms"]) == 5 for r in records)
    training = [r for r in records if r["point"]["workflow"] == "training"]
    assert all(isinstance(r["loss"], float) for r in training)


def test_sweep_with_one_failing_point_keeps_every_other_row(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cpbench(["-m", "device=cpu", "cp=1,2", "N=32,64", "routine=timing", *fault_model("exit", 48),
                        f"hydra.sweep.dir={sweep}", "report.out=docs/cp_benchmark.md"], cwd=tmp_path, timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_point = {(r["point"]["cp"], r["point"]["N"]): r for _, r in iter_results(sweep)}
    assert set(by_point) == {(1, 32), (1, 64), (2, 32), (2, 64)}
    assert by_point[(2, 64)]["status"] == "error" and "exited with code 3" in by_point[(2, 64)]["message"]
    assert all(r["status"] == "ok" for k, r in by_point.items() if k != (2, 64))
    assert "[4/4]" in proc.stdout + proc.stderr  # the sweep's progress count
    if HAS_REPORT:
        table = pd.read_csv(sweep / "cp_benchmark.csv")
        assert len(table) >= 4
        assert (tmp_path / "docs" / "cp_benchmark.md").exists()  # report.out, relative to the launch dir


def test_cp_beyond_the_local_gpus_is_a_row_in_a_sweep_and_an_error_alone(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cpbench(["-m", "device=cuda", "cp=1,2", "routine=timing", "N=32", *fault_model("none"),
                        f"hydra.sweep.dir={sweep}", "report.out=null"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [r for _, r in iter_results(sweep)]
    assert len(records) == 2 and all(r["status"] == "insufficient_gpus" for r in records)

    alone = run_cpbench(["device=cuda", "cp=2", "routine=timing", "N=32", *fault_model("none"),
                         f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, timeout_s=120)
    assert alone.returncode == 2
    assert alone.stderr.strip().startswith("cpbench: error: cp=2:") and len(alone.stderr.strip().splitlines()) == 1


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(not HAS_REPORT or shutil.which("git") is None, reason="needs the report and git")
def test_a_multirun_in_a_repository_leaves_git_status_clean(tmp_path):
    """report.out defaults to null: the report lands in the sweep directory (outputs/, ignored)
    and nowhere else, so a multirun started in a checkout leaves nothing for git to see."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    shutil.copyfile(REPO_ROOT / ".gitignore", repo / ".gitignore")
    _git(repo, "init", "-q")
    _git(repo, "add", ".gitignore")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ignore list")

    proc = run_cpbench(["-m", "device=cpu", "cp=1", "N=32,48", "routine=timing", *fault_model("none")],
                       cwd=repo, timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    (sweep,) = (repo / "outputs" / "multirun").glob("*/*")
    assert {"cp_benchmark.md", "cp_benchmark.csv"} <= {p.name for p in sweep.iterdir()}
    assert sorted(p.name for p in repo.iterdir()) == [".git", ".gitignore", "outputs"]

    from cpbench.report.__main__ import main as report_main

    before = sorted(p.relative_to(repo) for p in repo.rglob("*") if ".git" not in p.parts)
    assert report_main([str(sweep)]) == 0  # python -m cpbench.report DIR: DIR only, the same default
    assert sorted(p.relative_to(repo) for p in repo.rglob("*") if ".git" not in p.parts) == before


def test_a_model_key_on_a_cpu_keeps_the_tiny_swap_and_the_key(tmp_path):
    """``python -m cpbench model.kernels=torch`` on a laptop runs the tiny sizes with torch kernels."""
    run_dir = tmp_path / "run"
    proc = run_cpbench(["device=cpu", "cp=1", "routine=timing", "N=16", "model.kernels=torch", "workflow.sampling=false",
                        "workflow.recycles=0", f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout_s=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [r for _, r in iter_results(run_dir)]
    model = record["point"]["model"]
    assert (model["name"], model["blocks"], model["c_z"], model["kernels"]) == ("tiny", 2, 16, "torch")
    assert record["routine"] == "timing" and "keeping model.kernels" in record["notes"][0]
    logged = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "cpbench: " in ln]
    assert "timing at N=16 of model tiny" in logged[0] and "keeping model.kernels" in logged[1]  # what runs, first


@pytest.mark.parametrize("where", ["--config-dir", "hydra.searchpath"])
def test_a_model_option_from_the_users_config_dir_runs(tmp_path, where):
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "mine.yaml").write_text("name: mine\n_target_: tests.helpers.faults.FaultAdapter\nfault: none\n")
    flags = ["--config-dir", str(mine)] if where == "--config-dir" else [f"hydra.searchpath=[file://{mine}]"]
    run_dir = tmp_path / "run"
    proc = run_cpbench([*flags, "model=mine", "device=cpu", "cp=1", "routine=timing", "N=32", f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [r for _, r in iter_results(run_dir)]
    assert record["status"] == "ok" and record["point"]["model"]["name"] == "mine"
    nope = run_cpbench([*flags, "model=nope", "device=cpu"], cwd=tmp_path, timeout_s=60)
    assert nope.returncode == 2 and nope.stderr.strip().startswith("cpbench: error: model=nope: one of ")
    assert "mine" in nope.stderr and len(nope.stderr.strip().splitlines()) == 1
