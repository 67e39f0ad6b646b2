"""The SLURM launcher without a cluster: what it asks SLURM for, and how it reads SLURM's answers.

The sbatch test runs the real multirun (``python -m cpbench -m hydra/launcher=slurm``) with a
fake ``sbatch`` first on PATH that keeps every submitted script, so it asserts what a real
cluster would have been sent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from cpbench.sweep.resources import JobResources, resources_for
from cpbench.sweep.slurm_state import StateReader

from helpers.fake_slurm import FAKE_SBATCH, fake_slurm_bin, fake_slurm_env, sbatch_flags
from helpers.run import REPO_ROOT, fault_model


def test_sbatch_scripts_ask_for_one_task_per_rank_and_gpus_per_node(tmp_path):
    bin_dir, scripts = fake_slurm_bin(tmp_path)
    sweep_dir, report_out = tmp_path / "sweep", tmp_path / "docs" / "cp_benchmark.md"
    env = fake_slurm_env(bin_dir, scripts)
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "cp=2,4,8", "routine=probe", "N=64",
         *fault_model("none"), "hydra.launcher.gpus_per_node=4", "hydra.launcher.wait=false",
         "hydra.launcher.partition=h200", "hydra.launcher.cpus_per_task=8", "hydra.launcher.timeout_min=30",
         "+hydra.launcher.additional_parameters.mail-type=END", f"hydra.sweep.dir={sweep_dir}",
         f"report.out={report_out}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    asked = {}
    for path in sorted(scripts.glob("*.sh")):
        text = path.read_text()
        flags = sbatch_flags(text)
        cp = int(flags["job-name"].rsplit("_cp", 1)[1])
        asked[cp] = (int(flags["nodes"]), int(flags["ntasks-per-node"]), int(flags["gpus-per-node"]))
        # The user's settings reach sbatch; srun starts one process (rank slot) per task.
        assert flags["partition"] == "h200" and flags["cpus-per-task"] == "8" and flags["time"] == "30"
        assert flags["mail-type"] == "END"
        assert re.search(r"^srun .* -m submitit\.core\._submit ", text, flags=re.M)
    assert asked == {2: (1, 2, 2), 4: (1, 4, 4), 8: (2, 4, 4)}

    # wait=false: job ids and the sweep dir printed, a manifest written, no (empty) report built.
    assert f"sweep dir: {sweep_dir}" in proc.stdout and "python -m cpbench.report" in proc.stdout
    manifest = json.loads((sweep_dir / "slurm_jobs.json").read_text())
    assert sorted(j["cp"] for j in manifest["jobs"]) == [2, 4, 8]
    assert all(j["slurm_job_id"] in proc.stdout for j in manifest["jobs"])
    assert not report_out.exists() and not (sweep_dir / "cp_benchmark.md").exists()


def test_cpu_cluster_puts_every_rank_on_one_node_without_gpu_request():
    res = resources_for(cp=2, gpus_per_node=0)
    assert res == JobResources(cp=2, nodes=1, tasks_per_node=2, gpus_per_node=0)
    assert res.submitit_params()["gpus_per_node"] is None and res.sbatch_extras() == {}


def test_cp_not_a_multiple_of_node_size_asks_for_exactly_cp_tasks():
    res = resources_for(cp=6, gpus_per_node=4)
    assert (res.nodes, res.tasks_per_node, res.gpus_per_node) == (2, 4, 4)
    assert res.sbatch_extras() == {"ntasks": 6}


def test_states_come_from_scontrol_when_accounting_is_disabled(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sacct": "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n",
        # An array with task 0 timed out, task 1 requeued, tasks 2-3 not yet split off.
        "scontrol": "#!/bin/sh\ncat <<'EOF'\n"
                    "JobId=41 ArrayJobId=40 ArrayTaskId=0 JobName=cpbench_cp2 JobState=TIMEOUT Reason=TimeLimit "
                    "ExitCode=0:15 NodeList=n1\n"
                    "JobId=42 ArrayJobId=40 ArrayTaskId=1 JobName=cpbench_cp2 JobState=PENDING Reason=BeginTime "
                    "ExitCode=0:0 NodeList=(null)\n"
                    "JobId=40 ArrayJobId=40 ArrayTaskId=2-3%4 JobName=cpbench_cp2 JobState=PENDING "
                    "Reason=Resources ExitCode=0:0 NodeList=(null)\nEOF\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    states = StateReader().states(["40_0", "40_1", "40_3", "40_9"])
    assert states["40_0"].state == "TIMEOUT" and states["40_0"].terminal and states["40_0"].reason == "TimeLimit"
    assert states["40_1"].state == "PENDING" and not states["40_1"].terminal
    assert states["40_3"].state == "PENDING"
    assert states["40_9"].state == "UNKNOWN" and not states["40_9"].terminal


def test_launcher_is_found_by_hydra_plugin_discovery():
    out = subprocess.run(
        [sys.executable, "-c", "from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher;"
         "print([f'{c.__module__}.{c.__name__}' for c in Plugins.instance().discover(Launcher)])"],
        cwd=REPO_ROOT.parent, capture_output=True, text=True, timeout=60)
    assert "hydra_plugins.cpbench_launcher.slurm_launcher.CpbenchSlurmLauncher" in out.stdout, out.stderr


def test_derived_resources_cannot_be_overridden(tmp_path):
    key = "nodes"
    bin_dir, scripts = fake_slurm_bin(tmp_path)
    env = fake_slurm_env(bin_dir, scripts)
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "cp=2", *fault_model("none"),
         f"+hydra.launcher.{key}=3", "hydra.launcher.wait=false", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         "report.out=null"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"cpbench: error: hydra.launcher.{key}=3: derived from cp" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(scripts.glob("*.sh"))


def test_points_sbatch_refuses_become_rows_and_the_others_are_submitted(tmp_path):
    bin_dir, scripts = fake_slurm_bin(tmp_path)
    # This fake cluster refuses any job asking for more than 4 tasks per node.
    (bin_dir / "sbatch").write_text(
        "#!/usr/bin/env bash\n"
        "if grep -q -- '--ntasks-per-node=8' \"$1\"; then\n"
        "  echo 'sbatch: error: Batch job submission failed: Requested node configuration is not available' >&2\n"
        "  exit 1\nfi\n" + FAKE_SBATCH.split("\n", 1)[1])
    sweep_dir = tmp_path / "sweep"
    env = fake_slurm_env(bin_dir, scripts)
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "cp=4,8", "routine=timing", "N=64",
         *fault_model("none"), "hydra.launcher.gpus_per_node=8", "hydra.launcher.wait=false",
         f"hydra.sweep.dir={sweep_dir}", "report.out=null"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = json.loads((sweep_dir / "1" / "result.json").read_text())
    assert refused["status"] == "error" and refused["point"]["cp"] == 8
    assert "sbatch refused the job (1 node(s) x 8 task(s), 8 GPUs/node)" in refused["message"]
    assert "Requested node configuration is not available" in refused["message"]
    assert [j["cp"] for j in json.loads((sweep_dir / "slurm_jobs.json").read_text())["jobs"]] == [4]


def test_job_killed_at_time_limit_becomes_timeout_row_with_its_measured_points(tmp_path):
    from omegaconf import OmegaConf

    from cpbench.sweep import collect
    from cpbench.sweep.slurm_state import SlurmState

    from helpers.run import compose_cfg

    out_dir = tmp_path / "sweep" / "3"
    out_dir.mkdir(parents=True)
    (out_dir / "probe_state.json").write_text(json.dumps({"signature": "x", "depth": None, "points": [
        {"N": 512, "fits": True, "status": "ok", "message": "", "seconds": 9.0, "order": 0},
        {"N": 1024, "fits": False, "status": "oom", "message": "CUDA out of memory", "seconds": 7.0, "order": 1}]}))
    cfg = compose_cfg("cp=2", "device=cpu", "routine=probe", *fault_model("none"))
    entry = {"num": 3, "slurm_job_id": "77_3", "overrides": ["cp=2"], "task_overrides": ["cp=2", "routine=probe"],
             "config": OmegaConf.to_container(cfg, resolve=True), "gpus_per_node": 0,
             "output_dir": str(out_dir), "stdout": "o.log", "stderr": "e.log",
             "result_pickle": str(tmp_path / "none.pkl"), "submitted_at": 0.0}

    ret = collect._failure(entry, SlurmState("77_3", "TIMEOUT", "TimeLimit", "0:15", "n7"), "")
    record = json.loads((out_dir / "result.json").read_text())
    assert record["status"] == "timeout" and record["signature"] is None
    assert record["message"].startswith("SLURM job 77_3 TIMEOUT: SLURM time limit reached")
    assert record["slurm"] == {"job_id": "77_3", "state": "TIMEOUT", "reason": "TimeLimit", "exit_code": "0:15",
                                "node_list": "n7", "stdout": "o.log", "stderr": "e.log"}
    assert [p["N"] for p in record["points"]] == [512, 1024]
    assert (record["max_n"], record["first_fail_n"], record["point"]["cp"]) == (512, 1024, 2)
    assert ret.return_value.startswith("inference 1d cp=2 probe timeout max_n=512")


def test_an_emulated_point_asks_for_one_task_and_one_gpu(tmp_path):
    """emulate=true runs rank 0 of cp=K alone: cp=8 emulated is one task on one GPU, beside a real cp=2."""
    bin_dir, scripts = fake_slurm_bin(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "cpbench", "-m", "hydra/launcher=slurm", "cp=2,8", "emulate=true,false", "routine=probe",
         *fault_model("none"), "hydra.launcher.gpus_per_node=4", "hydra.launcher.wait=false",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, env=fake_slurm_env(bin_dir, scripts), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked = sorted((int(f["nodes"]), int(f["ntasks-per-node"]), int(f["gpus-per-node"]))
                   for f in (sbatch_flags(p.read_text()) for p in scripts.glob("*.sh")))
    assert asked == [(1, 1, 1), (1, 2, 2), (2, 4, 4)], asked  # both emulated points share one array
