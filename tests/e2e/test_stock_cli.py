"""``python -m cpbench -m model=stock/...`` end to end on the CPU: for each installed stock model a
timing point and its max-N probe (``routine=auto`` with N), real worker processes, under a
``memory.limit_gib`` cap, and the report over them (CI installs the packages with
``scripts/install_stock.sh all``; a model whose package is missing is left out, named in the skip).

At the tiny sizes (c_s 32, c_z 16, 3 blocks; triangle attention 4 heads x 32 as published) under
0.125 GiB, in fp32 on 2 cores (2026-12-04): Boltz-2 and Protenix fit N=128 and run out of memory
at 256, OpenFold3 fits 256 (an 11 s step) and fails at 384; the sweep took 113 s with the
probes' verification re-runs, a third of it OpenFold3's two steps at 256. The verification is
off here (``probe.verify=false``): what this checks is each stock model's path through the probe
and the timing; the re-runs are checked by the headline and predict tests.
"""

from __future__ import annotations

import pytest

from cpbench.models.stock import STOCK_PACKAGES
from cpbench.models.stock.packages import StockPackageError, import_trunk_module
from cpbench.report.memory_model import GPU_MEMORY_SIZES_GIB
from cpbench.results import iter_results

from helpers.run import run_cpbench


def _installed() -> list[str]:
    models = []
    for model in STOCK_PACKAGES:
        try:
            import_trunk_module(model)
        except StockPackageError:
            continue
        models.append(model)
    return models


INSTALLED = _installed()
MISSING = [m for m in STOCK_PACKAGES if m not in INSTALLED]
TINY = ["model.c_s=32", "model.c_z=16", "model.blocks=3", "model.heads_single=4"]


@pytest.fixture(scope="module")
def stock_sweep(tmp_path_factory):
    if not INSTALLED:
        pytest.skip("no stock package installed: bash scripts/install_stock.sh all")
    launch = tmp_path_factory.mktemp("stock_sweep")
    sweep = launch / "sweep"
    proc = run_cpbench(["-m", "model=" + ",".join(f"stock/{m}" for m in INSTALLED), "device=cpu", "dtype=fp32",
                        "N=32", *TINY, "memory.limit_gib=0.125", "probe.start=64", "probe.granularity=128",
                        "probe.verify=false",
                        f"hydra.sweep.dir={sweep}", "report.out=null"], cwd=launch, timeout_s=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


@pytest.mark.slow
def test_each_stock_model_gives_an_ok_timing_and_an_oom_bounded_max_n(stock_sweep):
    records = [r for _, r in iter_results(stock_sweep)]
    by_model = {}
    for rec in records:
        by_model.setdefault(rec["point"]["model"]["name"], {})[rec["routine"]] = rec
    assert set(by_model) == {f"stock-{m}" for m in INSTALLED}, (set(by_model), MISSING)
    for name, pair in by_model.items():
        timing, probe = pair["timing"], pair["probe"]
        assert timing["status"] == "ok" and timing["point"]["cp"] == 1 and timing["median_ms"] > 0, (name, timing["message"])
        assert len(timing["times_ms"]) == 5 and timing["stats"]["kernels"] == "torch"
        assert timing["stats"]["package"].startswith(STOCK_PACKAGES[name.removeprefix("stock-")].distribution + " ")
        assert probe["status"] == "ok" and probe["point"]["memory_limit_gib"] == 0.125, (name, probe["message"])
        assert probe["max_n"] >= 64 and probe["first_fail_status"] == "oom", (name, probe)
        assert probe["first_fail_n"] - probe["max_n"] <= 128  # bisected to probe.granularity
        assert probe["depth"] == 2 and probe["depth_verified"] is True  # run_blocks checked against all 3 blocks
    if MISSING:
        pytest.skip(f"not installed here: {', '.join(MISSING)} (bash scripts/install_stock.sh all)")


@pytest.mark.slow
def test_report_predicts_each_stock_max_n_at_the_gpu_sizes(stock_sweep):
    text = (stock_sweep / "cp_benchmark.md").read_text()
    memory = text.split("## Memory model\n", 1)[1].split("\n## ", 1)[0]
    for model in INSTALLED:
        title = STOCK_PACKAGES[model].title
        rows = [line for line in memory.splitlines() if line.startswith(f"| stock {title} trunk: inference 1d cp=1")]
        predictions = [line for line in rows if line.count("|") > 10]  # the predictions table, not the fits table
        assert len(predictions) == 1, memory  # cp=1 only: a single-GPU baseline
        cells = [c.strip() for c in predictions[0].strip("|").split("|")]
        assert cells[1] == "1" and all(c.isdigit() for c in cells[2:2 + len(GPU_MEMORY_SIZES_GIB)]), cells
