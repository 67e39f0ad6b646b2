"""The timing routine: slowest rank per iteration, statistics, per-rank peaks, profiler traces."""

from __future__ import annotations

from cpbench.results import read_json
from cpbench.routines.timing import summarize_times

from helpers.run import fault_model, run_cpbench


def test_iteration_time_is_the_slowest_rank():
    out = summarize_times([[1.0, 5.0, 3.0, 2.0, 4.0], [2.0, 1.0, 3.5, 2.5, 9.0]])
    assert out["times_ms"] == [2.0, 5.0, 3.5, 2.5, 9.0]
    assert out["median_ms"] == 3.5 and out["min_ms"] == 2.0 and out["max_ms"] == 9.0
    assert out["iqr_ms"] == 5.0 - 2.5


def test_timing_point_records_statistics_per_rank_peaks_and_a_trace_per_rank(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cpbench(["device=cpu", "cp=2", "routine=timing", "N=40", "profile=true", *fault_model("none"),
                        f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout_s=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_json(run_dir / "result.json")
    assert record["status"] == "ok" and record["routine"] == "timing"
    assert len(record["times_ms"]) == 5 and len(record["warmup_ms"]) == 3
    per_rank = record["times_ms_per_rank"]
    assert record["times_ms"] == [max(a, b) for a, b in zip(*per_rank)]
    assert record["min_ms"] <= record["median_ms"] <= record["max_ms"]
    assert record["tokens_per_s"] > 0 and len(record["peak_alloc_gib_per_rank"]) == 2
    assert record["peak_alloc_gib"] == max(record["peak_alloc_gib_per_rank"])
    assert record["memory_measure"] == "cpu_peak_rss_above_baseline"
    assert (run_dir / "trace_rank0.json").stat().st_size > 0 and (run_dir / "trace_rank1.json").exists()
    assert "median" in proc.stdout and "timed one inference step at N=40" in proc.stdout
