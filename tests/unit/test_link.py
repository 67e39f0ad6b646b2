"""The communication model (``cpbench.link``) and the emulation's configuration keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cpbench.config import ConfigError, normalize_overrides
from cpbench.link import Link, LinkError, StepRange, link_from_config, predict

from helpers.run import compose_cfg, compose_point

GB = 1e9


def two_point_link() -> Link:
    return link_from_config({"name": "t", "source": "test", "latency_us": 10,
                             "busbw_gbps": {"all_gather": {1 << 20: 100, 1 << 30: 400}, "p2p": {1 << 20: 200}}})


def test_a_call_costs_latency_plus_sent_bytes_over_bus_bandwidth_interpolated_in_log_size():
    link = two_point_link()
    assert link.busbw("all_gather", 1 << 20) == 100 and link.busbw("all_gather", 1 << 30) == 400
    assert link.busbw("all_gather", 1 << 25) == pytest.approx(250)  # halfway in log-size
    assert link.busbw("all_gather", 1 << 10) == 100 and link.busbw("all_gather", 1 << 40) == 400  # clamped
    ms = link.comm_ms({"all_gather": {"calls": 4, "bytes": 4 << 30}, "p2p": {"calls": 2, "bytes": 2 << 20}})
    assert ms["all_gather"] == pytest.approx(4 * 10e-3 + (4 << 30) / (400 * GB) * 1e3)
    assert ms["p2p"] == pytest.approx(2 * 10e-3 + (2 << 20) / (200 * GB) * 1e3)
    # a kind the link does not name is priced as an all-to-all; none here: one line naming it
    with pytest.raises(LinkError, match="all_reduce"):
        link.comm_ms({"all_reduce": {"calls": 1, "bytes": 8}})


def test_the_step_range_is_max_of_compute_and_comm_up_to_their_sum():
    step = StepRange(compute_ms=100.0, comm_ms=30.0)
    assert (step.full_overlap_ms, step.no_overlap_ms, step.dominant) == (100.0, 130.0, "compute")
    assert StepRange(10.0, 30.0).dominant == "communication"
    block = predict(two_point_link(), {"all_gather": {"calls": 1, "bytes": 1 << 30}}, compute_ms=1.0)
    assert block["step_ms_range"][0] == pytest.approx(block["comm_ms"]) and block["dominant"] == "communication"
    assert block["link"]["name"] == "t"


def test_the_h200_preset_cites_its_figures_and_measured_reads_a_calibration_file(tmp_path):
    preset = compose_point("device=cpu", "model=tiny").link
    assert preset["name"] == "h200_nvlink" and "measured" in preset["source"]
    assert link_from_config(preset).busbw("all_to_all", 1 << 30) == 317
    calibration = {"name": "measured", "source": "python -m cpbench.link on node1", "latency_us": 7.5,
                   "busbw_gbps": {k: {"65536": 20, "1073741824": 300} for k in
                                  ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p")},
                   "comm_memory_gib": 1.25}
    path = tmp_path / "link.json"
    path.write_text(json.dumps(calibration))
    point = compose_point("device=cpu", "model=tiny", "link=measured", f"link.file={path}")
    assert link_from_config(point.link).latency_us == 7.5 and point.link["comm_memory_gib"] == 1.25


@pytest.mark.parametrize("overrides, key", [
    (("link=measured",), "link.file"),
    (("link=measured", "link.file=/no/such/file.json"), "link.file"),
    (("+link.busbw_gbps.ring=1",), "link.busbw_gbps.ring"),
    (("link.latency_us=-1",), "link.latency_us"),
    (("emulate.enabled=maybe",), "emulate"),
    (("emulate.enabled=true", "emulate.comm_reserve_gib=-2"), "emulate.comm_reserve_gib"),
])
def test_bad_link_and_emulation_keys_are_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose_point("device=cpu", "model=tiny", *overrides)
    assert err.value.key == key and "\n" not in str(err.value)


def test_emulate_true_on_the_command_line_keeps_the_nodes_allowance():
    assert normalize_overrides(["emulate=true", "cp=4"]) == ["emulate.enabled=true", "cp=4"]
    assert normalize_overrides(["emulate.comm_reserve_gib=2", "+emulate=false"]) == [
        "emulate.comm_reserve_gib=2", "+emulate.enabled=false"]
    typed = normalize_overrides(["emulate=true", "emulate.comm_reserve_gib=1.5"])
    point = compose_point("device=cpu", "model=tiny", "cp=4", *typed)
    assert (point.emulate, point.comm_reserve_gib, point.ranks_launched) == (True, 1.5, 1)
    record = point.record()
    assert record["emulated"] is True and record["emulation"]["K"] == 4 and record["emulation"]["grid"] == [4]
    # the compose API (and an experiment file) may replace the node by a plain bool: defaults then
    cfg = compose_cfg("device=cpu", "model=tiny", "cp=2")
    cfg.emulate = True
    from cpbench.config import resolve_point

    assert resolve_point(cfg).emulate and resolve_point(cfg).comm_reserve_gib == 0.0  # gloo: nothing held back
    assert compose_point("device=cpu", "model=tiny").record()["emulated"] is False


def test_link_calibration_needs_two_gpus_and_says_so_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cpbench.link", "--out", str(tmp_path / "l.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "l.json").exists()
    assert proc.stderr.strip().count("\n") == 0 and "needs 2" in proc.stderr
