"""Per-stage peaks (StageTimer on CUDA, faked here), their report columns and plot, and NVML energy."""

from __future__ import annotations

import sys
import types

import pandas as pd
import torch

from cpbench.harness import energy
from cpbench.models.pairformer import stage_timer
from cpbench.report.plots import plot_stage_peak
from cpbench.report.rows import STAGE_PEAK_PREFIX
from cpbench.report.sections import results_section


class FakeCuda:
    """The allocator's peak counter: ``alloc(b)`` raises the peak, ``reset`` sets it to ``current``."""

    def __init__(self):
        self.current, self.peak, self.resets = 0, 0, 0

    def alloc(self, nbytes):
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def free(self, nbytes):
        self.current -= nbytes

    def reset(self, device=None):
        self.resets += 1
        self.peak = self.current


class FakeEvent:
    def __init__(self, enable_timing=True):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 1.0


def test_stage_peaks_nest_and_fold_on_cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    gib = 2**30
    timer = stage_timer.StageTimer("cuda")
    fake.alloc(1 * gib)  # weights, before any stage
    with timer.stage("trunk"):
        fake.alloc(4 * gib)  # trunk peak 5 GiB before the nested embedding resets the counter
        fake.free(4 * gib)
        with timer.stage("embedding"):
            fake.alloc(1 * gib)
            fake.free(1 * gib)
    with timer.stage("sampling"):
        fake.alloc(2 * gib)
        fake.free(2 * gib)
    assert timer.peaks_gib() == {"trunk": 5.0, "embedding": 2.0, "sampling": 3.0}
    assert fake.resets == 3


def test_no_stage_peaks_on_cpu():
    timer = stage_timer.StageTimer("cpu")
    with timer.stage("trunk"):
        pass
    assert timer.peaks_gib() == {} and "trunk" in timer.ms()


def test_stage_peak_columns_and_plot(tmp_path):
    rows = pd.DataFrame([{
        "row": "timing", "status": "ok", "walltime (ms)": 10.0, "N_tokens": n, "N_atoms": 8 * n, "MSA_seq": 1,
        "CP config": "1d cp=1", "peak_mem (GiB)": 3.0, "workflow": "inference", "model": "m", "dtype": "bf16",
        "cp": 1, "message": "", "date": "2026", "IQR (ms)": 0.0, "tokens/s": 1.0, "TFLOP/s/GPU": None, "MFU": None,
        "result": f"{n}/result.json", STAGE_PEAK_PREFIX + "trunk": 2.5, STAGE_PEAK_PREFIX + "sampling": 3.0,
        "energy (J/step)": 12.0} for n in (64, 128)])
    text = results_section(rows)
    assert "stage peaks (GiB)" in text and "trunk 2.50" in text and "energy (J/step)" in text
    assert plot_stage_peak(rows, tmp_path / "p.png") is None and (tmp_path / "p.png").exists()
    assert plot_stage_peak(rows.drop(columns=[c for c in rows if c.startswith(STAGE_PEAK_PREFIX)]),
                           tmp_path / "q.png") is not None


def test_gpu_energy_reads_nvml_in_joules_and_is_none_without_it(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(i) or i,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 123456)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert energy.gpu_energy_j(1) == 123.456 and calls == [5]

    def no_counter(handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake.nvmlDeviceGetTotalEnergyConsumption = no_counter
    assert energy.gpu_energy_j(0) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert energy.gpu_energy_j(0) is None


def test_a_probe_point_keeps_each_stage_peak_largest_over_ranks_and_its_max_n_row_shows_them(tmp_path):
    from pathlib import Path

    from cpbench.harness.runner import PointResult
    from cpbench.report.rows import result_rows
    from cpbench.routines.probe import _step_seconds

    ranks = [{"times_ms": [1500.0], "stats": {"compile_s": 0.5, "stage_peak_gib": {"embedding": 1.0, "trunk": 7.0}}},
             {"times_ms": [2000.0], "stats": {"compile_s": 0.2, "stage_peak_gib": {"embedding": 1.5, "trunk": 6.0}}}]
    point = _step_seconds(PointResult("ok", "", ranks))
    assert point == {"step_s": 2.0, "compile_s": 0.5, "stage_peak_gib": {"embedding": 1.5, "trunk": 7.0}}
    assert _step_seconds(PointResult("timeout", "", [{"times_ms": []}, ranks[1]])) == {}  # a rank did not finish

    record = {"routine": "probe", "status": "ok", "max_n": 512, "first_fail_n": 640, "first_fail_status": "oom",
              "point": {"workflow": "inference", "topology": "1d", "cp": 2, "mesh_shape": [2], "N": 64, "S": 1,
                        "dtype": "bf16", "device": "cuda", "model": {"name": "m"}},
              "points": [{"N": 512, "fits": True, "status": "ok", "peak_alloc_gib": [7.0, 6.0], **point},
                         {"N": 640, "fits": False, "status": "oom", "peak_alloc_gib": [None, None]}]}
    rows = result_rows([(Path(tmp_path / "r.json"), record)], Path(tmp_path))
    (fit,) = [r for _, r in rows.iterrows() if r["row"] == "max-fit"]
    assert (fit[STAGE_PEAK_PREFIX + "trunk"], fit[STAGE_PEAK_PREFIX + "embedding"]) == (7.0, 1.5)
    assert plot_stage_peak(rows, tmp_path / "p.png") is None and (tmp_path / "p.png").exists()
