"""routine=auto: a timing at N when the resolved config has one, plus one max-N probe per
configuration, else the probe alone; the CPU cap per workflow, and the advice of a probe whose
first point already fails."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from cpbench.config import AUTO_LIMIT_GIB, ConfigError, resolve_point, resolve_routine
from cpbench.harness.runner import PointResult
from cpbench.harness.slots import Slots, SupervisorGroup
from cpbench.job import _probe_decision, probe_config
from cpbench.results import one_line, summary, write_json_atomic
from cpbench.routines.probe import Probe

from helpers.run import compose_cfg, compose_point, run_cpbench


class ScriptedRunner:
    """Fits up to ``max_fit_n`` (peak n/1000 GiB), out of memory above."""

    def __init__(self, max_fit_n: int):
        self.max_fit_n = max_fit_n
        self.group = SupervisorGroup(Slots("local", 2, 0, 1, (0, 1), (0, 0)))

    def run(self, task) -> PointResult:
        if task.N > self.max_fit_n:
            ranks = [{"rank": r, "status": "oom", "message": "out of memory", "peak_alloc_gib": None} for r in (0, 1)]
            return PointResult("oom", "rank 1: out of memory", ranks, 1.0)
        ranks = [{"rank": r, "status": "ok", "peak_alloc_gib": task.N / 1000, "peak_reserved_gib": task.N / 1000}
                 for r in (0, 1)]
        return PointResult("ok", "", ranks, 1.0)


def test_auto_is_a_timing_when_the_resolved_config_has_n_else_the_probe():
    cfg = compose_cfg()
    assert cfg.routine == "auto" and cfg.N is None
    assert resolve_routine("auto", 1024) == "timing" and resolve_routine("auto", None) == "probe"
    assert resolve_routine("probe", 1024) == "probe" and resolve_routine("timing", 1024) == "timing"
    timing = compose_point("device=cpu", "model=tiny", "N=64")
    assert (timing.routine, timing.N, timing.N_atoms) == ("timing", 64, 8 * 64)
    probe = compose_point("device=cpu", "model=tiny")
    assert (probe.routine, probe.N, probe.N_atoms) == ("probe", None, None)
    assert probe.record()["N"] is None and probe.probe.start == 128


def test_auto_follows_n_set_anywhere_not_only_on_the_command_line():
    """N from a named sweep (cpbench/conf/sweep/strong.yaml sets N, routine=timing) or an interpolation
    resolves like N typed on the command line; what decides is the composed config."""
    cfg = compose_cfg("device=cpu", "model=tiny")
    cfg.N = "${S}"  # set by a config file, not by any override
    assert resolve_point(cfg).routine == "timing" and resolve_point(cfg).N == 256
    strong = compose_cfg("device=cpu", "model=tiny", "sweep=strong", "routine=auto")
    assert resolve_point(strong).routine == "timing" and resolve_point(strong).N == 8192


def test_a_real_input_sets_n_so_auto_times_it():
    point = compose_point("device=cpu", "model=tiny", "dataset=real", "dataset.inputs=dna_duplex.fasta")
    assert (point.routine, point.N, point.input) == ("timing", 24, "dna_duplex.fasta")


@pytest.mark.parametrize("overrides, line", [
    (("routine=timing",), "N=null: a positive integer (tokens) for routine=timing"),
    (("N_atoms=500",), "N_atoms=500: null while N is null"),
    (("N=0",), "N=0: null or a positive integer"),
])
def test_n_null_mistakes_are_one_line(overrides, line):
    with pytest.raises(ConfigError) as err:
        compose_point("device=cpu", "model=tiny", *overrides)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_routine_timing_without_n_fails_before_any_job(tmp_path):
    proc = run_cpbench(["device=cpu", "model=tiny", "routine=timing", f"hydra.run.dir={tmp_path}/run"],
                       cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 2 and not (tmp_path / "run" / "result.json").exists()
    assert proc.stderr.strip().startswith("cpbench: error: N=null:") and len(proc.stderr.strip().splitlines()) == 1


def test_cpu_auto_cap_is_per_workflow_and_only_for_the_probe():
    inference = compose_point("device=cpu", "model=tiny", "dtype=fp32")  # bf16: its own cap (test_config)
    training = compose_point("device=cpu", "model=tiny", "workflow=training")
    assert inference.memory_limit_gib == AUTO_LIMIT_GIB["cpu"]["inference"]["fp32"]
    assert training.memory_limit_gib == AUTO_LIMIT_GIB["cpu"]["training"] > inference.memory_limit_gib
    timing = compose_point("device=cpu", "model=tiny", "workflow=training", "N=64")
    assert timing.memory_limit_gib is None  # an auto timing runs uncapped


def test_the_probe_of_a_configuration_does_not_depend_on_n_or_the_timings_breakdown():
    a, sig_a = probe_config(compose_cfg("device=cpu", "model=tiny", "cp=2", "N=32"))
    _, sig_b = probe_config(compose_cfg("device=cpu", "model=tiny", "cp=2", "N=64", "N_atoms=1000"))
    _, sig_c = probe_config(compose_cfg("device=cpu", "model=tiny", "cp=4", "N=32"))
    _, sig_d = probe_config(compose_cfg("device=cpu", "model=tiny", "cp=2", "N=32", "memory.breakdown=true"))
    _, sig_e = probe_config(compose_cfg("device=cpu", "model=tiny", "cp=2", "N=32", "memory.limit_gib=1"))
    _, sig_f = probe_config(compose_cfg("device=cpu", "model=tiny", "cp=2", "N=32", "memory.breakdown_sites=op"))
    assert a.routine == "probe" and sig_a == sig_b == sig_d == sig_f != sig_c and sig_e != sig_a


def test_one_job_takes_the_probe_lock(tmp_path):
    lock, result = tmp_path / "probes" / "sig.lock", tmp_path / "probes" / "sig" / "result.json"
    started = time.time() - 10
    assert _probe_decision(lock, result, "sig", started) == "run"
    assert lock.exists()
    assert _probe_decision(lock, result, "sig", started) == "other"
    write_json_atomic(result, {"signature": "sig"})
    assert _probe_decision(lock, result, "sig", started) == "done"


def test_a_requeued_job_takes_back_its_own_lock(tmp_path):
    """SLURM requeues a job into the same output directory: the lock it left names it."""
    lock, result = tmp_path / "sig.lock", tmp_path / "sig" / "result.json"
    started = time.time() - 10
    assert _probe_decision(lock, result, "sig", started, holder="/sweep/3") == "run"
    assert _probe_decision(lock, result, "sig", started, holder="/sweep/5") == "other"
    assert _probe_decision(lock, result, "sig", started, holder="/sweep/3") == "run"  # requeued job 3
    assert _probe_decision(lock, result, "sig", started) == "other"  # no name: never someone else's lock


def test_a_lock_left_by_an_interrupted_run_is_taken_over(tmp_path):
    lock, result = tmp_path / "sig.lock", tmp_path / "sig" / "result.json"
    lock.write_text("old\n")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    assert _probe_decision(lock, result, "sig", time.time() - 60) == "run"
    assert _probe_decision(lock, result, "sig", time.time() - 60) == "other"  # fresh now


def test_a_probe_whose_first_point_fails_says_what_to_change():
    point = compose_point("device=cpu", "model=tiny", "cp=2", "workflow=training")
    point = replace(point, probe=replace(point.probe, start=32, depth=None))
    out = Probe(point, ScriptedRunner(max_fit_n=16), None, "sig").run()
    assert out["max_n"] is None and out["status"] == "oom"
    cap = point.memory_limit_gib
    assert f"memory.limit_gib={2 * cap:.3g}" in out["advice"] and "probe.start=16" in out["advice"]
    record = {"routine": "probe", "point": {"workflow": "training", "topology": "1d", "cp": 2}, **out}
    assert "memory.limit_gib=" in one_line(record) and "probe.start=16" in one_line(record)
    assert out["advice"] in summary(record)
    fine = Probe(point, ScriptedRunner(max_fit_n=100), None, "sig").run()
    assert fine.get("advice") is None


def test_compose_cfg_keeps_routine_auto_in_the_config():
    assert OmegaConf.select(compose_cfg("N=64"), "routine") == "auto"


def test_readout_says_which_cp_sizes_were_measured_and_which_not():
    import pandas as pd

    from cpbench.report.readout import coverage_sentences

    rows = pd.DataFrame({"cp": [2, 2, 4, 8, 16], "status": ["ok", "oom", "ok", "insufficient_gpus", "error"]})
    (text,) = coverage_sentences(rows)
    assert text.startswith("CP sizes measured: 2, 4; not measured: cp=8 (needs 8 GPUs), cp=16 (error)"), text
    assert coverage_sentences(rows[rows["cp"] <= 4]) == ["CP sizes measured: 2, 4."]


def test_a_point_beyond_the_gpus_here_names_the_gpus_the_slurm_command_and_the_emulation(monkeypatch):
    from cpbench import job
    from cpbench.harness.slots import Slots

    monkeypatch.setattr(job, "local_gpu_count", lambda: 1)
    point = replace(compose_point("device=cpu", "model=tiny", "cp=4"), device="cuda")
    slots = Slots("local", 4, 0, 1, (0, 1, 2, 3), (0, 0, 0, 0))
    message = job._gpu_shortage(point, slots, ["workflow=training", "cp=4", "N=1024"])
    assert message == ("cp=4 needs 4 GPUs, 1 visible here; run it with: "
                       "python -m cpbench -m hydra/launcher=slurm workflow=training cp=4 N=1024; "
                       "or emulate it on one GPU (per-rank memory and compute; communication modelled): "
                       "python -m cpbench workflow=training cp=4 N=1024 emulate=true")
    emulated = replace(point, emulate=True)
    assert job._gpu_shortage(emulated, slots, ["cp=4", "emulate=true"]) is None  # one GPU is enough
