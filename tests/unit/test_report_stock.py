"""The report against a stock single-GPU baseline (``model=stock/*``), from hand-written result.json files.

The records hold what the report reads of a probe; the stock one names its adapter's ``_target_``,
which is how the report tells a stock model from the others (``rows.stock_title``). Figures are
shaped like an H200 run: the reference trunk at cp=1 and cp=2 against the stock Boltz-2 trunk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpbench.report import build_report
from cpbench.report.headline import headline_rows
from cpbench.report.memory_model import GPU_MEMORY_SIZES_GIB
from cpbench.report.memory_table import memory_tables
from cpbench.report.readout import readout
from cpbench.report.rows import result_rows
from cpbench.results import SCHEMA_VERSION

STOCK_BOLTZ2 = {"name": "stock-boltz2", "_target_": "cpbench.models.stock.boltz2.Boltz2Adapter"}
REFERENCE = {"name": "boltz2", "_target_": "cpbench.models.pairformer.adapter.PairformerAdapter"}


def probe(model: dict, workflow: str, cp: int, max_n: int, fail_n: int | None, cause: str | None = "oom") -> dict:
    """A probe whose per-rank peak grows as 3e-6·N² + 2 GiB (a memory fit with a pair term)."""
    ns = [n for n in (1024, 2048, 4096, 8192, 16384) if n < max_n] + [max_n]
    points = [{"N": n, "fits": True, "status": "ok", "peak_alloc_gib": [3e-6 * n * n / cp + 2.0] * cp} for n in ns]
    if fail_n is not None:
        points.append({"N": fail_n, "fits": False, "status": cause, "peak_alloc_gib": [None] * cp})
    return {"routine": "probe", "status": "ok", "message": "",
            "point": {"workflow": workflow, "topology": "1d", "cp": cp, "mesh_shape": [cp], "N": 1024, "S": 256,
                      "dtype": "bf16", "device": "cuda", "model": dict(model), "memory_limit_gib": None},
            "max_n": max_n, "first_fail_n": fail_n, "first_fail_status": cause if fail_n else None, "points": points,
            "env": {"device": "cuda", "gpu_model": "NVIDIA H200", "gpu_memory_gib": 139.8,
                    "date": "2026-12-01T12:00:00+00:00"},
            "config": {"atoms_per_token": 8}, "overrides": []}


RECORDS = {
    "stock_inference": probe(STOCK_BOLTZ2, "inference", 1, 5120, 5248),
    "ref_inference_cp1": probe(REFERENCE, "inference", 1, 12288, 12416),
    "ref_inference_cp2": probe(REFERENCE, "inference", 2, 16384, 16512),
    # no stock training probe: training compares against its own cp=1
    "ref_training_cp1": probe(REFERENCE, "training", 1, 2560, 2688),
    "ref_training_cp2": probe(REFERENCE, "training", 2, 3584, 3712),
}


def rows_of(records: dict[str, dict], root: Path = Path("/r")):
    return result_rows([(root / name / "result.json", rec) for name, rec in records.items()], root)


def test_headline_compares_every_reference_config_with_the_stock_trunk_of_its_workflow():
    by_config = {(h.model, h.workflow, h.cp): h for h in headline_rows(rows_of(RECORDS))}
    assert by_config[("boltz2", "inference", 2)].ratio_text() == "3.20× the stock Boltz-2 trunk on one GPU (5,120)"
    assert by_config[("boltz2", "inference", 1)].ratio_text() == "2.40× the stock Boltz-2 trunk on one GPU (5,120)"
    assert by_config[("stock-boltz2", "inference", 1)].ratio_text() is None  # the baseline itself
    assert by_config[("boltz2", "training", 2)].ratio_text() == "1.40× cp=1"  # no stock training probe


def test_readout_says_how_many_times_the_stock_max_n_each_config_fits():
    text = readout(rows_of(RECORDS))
    assert ("1d cp=1 fits 12,288 tokens, 2.40× the stock Boltz-2 trunk on one GPU (5,120); "
            "1d cp=2 fits 16,384 tokens, 3.20× the stock Boltz-2 trunk on one GPU (5,120).") in text, text
    assert text.count("the stock Boltz-2 trunk on one GPU") == 2  # inference only: training has no stock probe


def test_a_user_baseline_overrides_the_stock_one():
    rows = rows_of(RECORDS)
    assert {h.ratio_text() for h in headline_rows(rows, baseline_max_n=8192) if h.model == "boltz2"
            and h.workflow == "inference"} == {"1.50× baseline", "2.00× baseline"}
    text = readout(rows, baseline_max_n=8192)
    assert "stock Boltz-2" not in text and "single-GPU baseline of 8,192" in text


@pytest.mark.parametrize("stock_fail, mark", [("oom", ""), ("timeout", "≤ ")])
def test_a_stock_max_n_that_is_only_a_lower_bound_makes_the_ratio_an_upper_bound(stock_fail, mark):
    records = dict(RECORDS, stock_inference=probe(STOCK_BOLTZ2, "inference", 1, 5120, 5248, stock_fail))
    cp2 = next(h for h in headline_rows(rows_of(records)) if (h.model, h.workflow, h.cp) == ("boltz2", "inference", 2))
    bound = "≥ " if mark else ""
    assert cp2.ratio_text() == f"{mark}3.20× the stock Boltz-2 trunk on one GPU ({bound}5,120)"


def test_stock_memory_prediction_is_at_the_gpu_sizes_and_cp1_only():
    _, predictions = memory_tables(list(RECORDS.values()))
    stock = predictions[predictions["fit from"].str.startswith("stock Boltz-2 trunk: ")]
    assert list(stock["fit from"]) == ["stock Boltz-2 trunk: inference 1d cp=1, N 1,024–5,120"]
    assert list(stock["cp"]) == [1]
    predicted = [int(stock[f"{size} GiB"].iloc[0]) for size in GPU_MEMORY_SIZES_GIB]
    # 3e-6·N² + 2 GiB reaches 40 GiB at N ≈ 3,559 and 192 GiB at N ≈ 7,958
    assert predicted == sorted(predicted) and abs(predicted[0] - 3559) <= 2 and abs(predicted[-1] - 7958) <= 2
    reference_cps = set(predictions[predictions["fit from"].str.startswith("inference 1d cp=2")]["cp"])
    assert reference_cps == {1, 2, 4, 8}  # the reference still scales to other cp


def test_report_headline_section_names_the_stock_baseline(tmp_path):
    root = tmp_path / "results"
    for name, record in RECORDS.items():
        (root / name).mkdir(parents=True)
        (root / name / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **record}))
    text = build_report(root)["markdown"].read_text()
    headline = text.split("## Headline\n", 1)[1].split("\n## ", 1)[0]
    assert "a stock model's single-GPU max N of the same workflow" in headline, headline
    assert "| boltz2 | inference | 1d cp=2 | 16,384 | 3.20× the stock Boltz-2 trunk on one GPU (5,120) |" in headline
