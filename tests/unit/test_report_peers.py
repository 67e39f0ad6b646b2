"""The report's Peer CP implementations section: the reference trunk (trunk only) beside Fold-CP,
per configuration and kernel class, with max N, time, per-rank peak in pair shards and the
ratios; a peer point that failed keeps its status, and the reference with an MSA module or a
configuration no peer ran stay out of it."""

from __future__ import annotations

import copy

from test_report_backends import section, timing_record, write

from cpbench.report import build_report
from cpbench.report.peers import pair_shard_gib

FOLDCP = "cpbench.models.foldcp.adapter.FoldCPBoltz2Adapter"
TRUNK_ONLY = ["model=boltz2", "model.msa_blocks=0", "workflow.sampling=false", "routine=timing"]


def on_2x2(record: dict) -> dict:
    rec = copy.deepcopy(record)
    rec["point"] |= {"topology": "2d", "cp": 4, "mesh_shape": [2, 2], "emulated": True}
    return rec


def reference(n: int, kernels: str, ms: float, peak: float, date: str, overrides=TRUNK_ONLY) -> dict:
    rec = on_2x2(timing_record(n, kernels, ms, peak, date))
    rec["overrides"] = list(overrides)
    rec["env"]["git_commit"] = "abc1234"
    return rec


def foldcp(n: int, kernels: str | None, ms: float, peak: float, date: str, backends=("reference", "reference"),
           error: str | None = None) -> dict:
    rec = on_2x2(timing_record(n, kernels, ms, peak, date))
    rec["point"]["model"] = {"name": "foldcp-boltz2", "_target_": FOLDCP, "tri_attn_backend": backends[0],
                             "pair_bias_backend": backends[1]}
    rec["stats"] |= {"package": "boltz 2.2.1 (Fold-CP 15f9775)"}
    if error:
        rec |= {"status": "error", "message": error, "median_ms": None, "stats": {}}
    return rec


SHARDS = 3.0  # the probe's per-rank peak: 0.5 GiB + three bf16 pair shards of a 2x2 grid


def probe(n: int, first_fail: int, date: str) -> dict:
    rec = reference(n, "torch", 1.0, 100.0, date)
    points = [{"N": m, "fits": True, "status": "ok", "peak_alloc_gib": 0.5 + SHARDS * pair_shard_gib(m, 4, "bf16")}
              for m in (n // 3, 2 * n // 3, n)]
    rec |= {"routine": "probe", "max_n": n, "first_fail_n": first_fail, "first_fail_status": "oom",
            "lower_bound": None, "points": points}
    return rec


def test_reference_beside_fold_cp_with_ratios_and_shards(tmp_path):
    root = tmp_path / "run"
    write(root, "ref_plain", reference(2048, "torch", 4000.0, 4.0, "2026-12-05T01:00:00+00:00"))
    write(root, "ref_probe", probe(30000, 30200, "2026-12-05T01:30:00+00:00"))
    write(root, "fcp_plain", foldcp(2048, "reference", 6000.0, 6.0, "2026-12-05T02:00:00+00:00"))
    text = section(build_report(root)["markdown"].read_text(), "Peer CP implementations")
    assert "**inference, 2d 2x2 cp=4 emulated, bf16 on H200, plain kernels**" in text, text
    shards = 4.0 / pair_shard_gib(2048, 4, "bf16")
    assert (f"| reference | cpbench abc1234 | torch | 30,000 | {SHARDS:.2f} | 2,048 | 4,000.0 | 4.00 | {shards:.2f} | ok "
            "| 2026-12-05 |") in text, text
    assert "| Fold-CP | boltz 2.2.1 (Fold-CP 15f9775) | reference | — | — | 2,048 | 6,000.0 | 6.00 |" in text, text
    assert "Fold-CP / reference at N=2,048: time 1.50×, peak 1.50×." in text


def test_a_failed_peer_keeps_its_error_and_kernel_class(tmp_path):
    """A Fold-CP point that failed before recording its kernels sits in the class its configured
    backends name (fastest: trifast + flex), with its error; no ratio without both ok."""
    root = tmp_path / "run"
    write(root, "ref_fast", reference(2048, "flex", 2700.0, 4.7, "2026-12-05T01:00:00+00:00"))
    write(root, "fcp_fast", foldcp(2048, None, 1.0, 1.0, "2026-12-05T02:00:00+00:00",
                                   backends=("trifast", "torch_flex_attn"), error="rank 0: No module named 'rdkit'"))
    text = section(build_report(root)["markdown"].read_text(), "Peer CP implementations")
    assert "fastest kernels**" in text and "plain kernels**" not in text, text
    assert "| trifast+flex | — | — | 2,048 | — | — | — | error: rank 0: No module named 'rdkit' |" in text, text
    assert "No N where both ran ok" in text


def test_only_the_trunk_only_reference_where_a_peer_ran(tmp_path):
    """The reference with its MSA module (``boltz2``) is another workload, and a configuration
    without a peer has no section."""
    root = tmp_path / "run"
    write(root, "ref_msa", reference(2048, "torch", 5000.0, 5.0, "2026-12-05T01:00:00+00:00",
                                     overrides=["model=boltz2", "routine=timing"]))
    write(root, "ref_1d", timing_record(2048, "torch", 12000.0, 9.0, "2026-12-05T01:00:00+00:00"))
    write(root, "fcp_plain", foldcp(2048, "reference", 6000.0, 6.0, "2026-12-05T02:00:00+00:00"))
    text = section(build_report(root)["markdown"].read_text(), "Peer CP implementations")
    assert "\n| reference |" not in text and "1d cp=1" not in text, text
    assert "| Fold-CP |" in text

    empty = tmp_path / "none"
    write(empty, "ref", reference(2048, "torch", 4000.0, 4.0, "2026-12-05T01:00:00+00:00"))
    assert "No peer implementation" in section(build_report(empty)["markdown"].read_text(), "Peer CP implementations")


def with_fill(record: dict, trunk_ms: float, fills_ms: list[float]) -> dict:
    """An emulated record whose last step's trunk stage still holds that step's fill (the worker
    takes the fills out of each timed step's total, not out of the adapter's stages)."""
    rec = copy.deepcopy(record)
    rec["stats"]["stage_ms"] = {"trunk": trunk_ms}
    rec["emulation_fill_ms"] = fills_ms
    return rec


def test_emulated_trunk_time_leaves_out_the_last_steps_fill(tmp_path):
    """The trunk stage compared is compute, as the step's median is: each side's last fill is
    taken out of it, so two peers whose emulation fills differ compare on what they compute."""
    root = tmp_path / "run"
    write(root, "ref", with_fill(reference(2048, "flex", 2000.0, 3.8, "2026-12-07T04:38:00+00:00"),
                                 2100.0, [90.0, 100.0]))
    write(root, "fcp", with_fill(foldcp(2048, "trifast+flex", 5600.0, 6.3, "2026-12-07T04:40:00+00:00",
                                        backends=("trifast", "torch_flex_attn")), 5750.0, [140.0, 150.0]))
    text = section(build_report(root)["markdown"].read_text(), "Peer CP implementations")
    assert "| reference | cpbench abc1234 | flex | — | — | 2,048 | 2,000.0 |" in text, text
    assert "| Fold-CP | boltz 2.2.1 (Fold-CP 15f9775) | trifast+flex | — | — | 2,048 | 5,600.0 |" in text, text
    assert "Fold-CP / reference at N=2,048: time 2.80×" in text, text


def on_1d(record: dict) -> dict:
    record["point"] |= {"topology": "1d", "mesh_shape": [4]}
    return record


def test_the_reference_1d_of_the_same_size_sits_beside_a_peers_grid(tmp_path):
    """The reference's 1d cp=4 rows join the 2x2 configuration a peer ran (as ``reference, 1d``),
    of the same kernel class only; the ratio stays the peer's over the reference's same grid."""
    root = tmp_path / "run"
    write(root, "ref_plain", reference(2048, "torch", 4000.0, 4.0, "2026-12-05T01:00:00+00:00"))
    write(root, "ref_1d_plain", on_1d(reference(2048, "torch", 3400.0, 5.0, "2026-12-05T01:10:00+00:00")))
    write(root, "ref_1d_fast", on_1d(reference(2048, "flex", 1300.0, 2.5, "2026-12-05T01:20:00+00:00")))
    write(root, "fcp_plain", foldcp(2048, "reference", 6000.0, 6.0, "2026-12-05T02:00:00+00:00"))
    text = section(build_report(root)["markdown"].read_text(), "Peer CP implementations")
    lines = [line for line in text.splitlines() if line.startswith("| reference") or line.startswith("| Fold-CP")]
    assert [line.split(" | ")[0] for line in lines] == ["| reference", "| reference, 1d", "| Fold-CP"], text
    assert "| reference, 1d | cpbench abc1234 | torch | — | — | 2,048 | 3,400.0 | 5.00 |" in text, text
    assert "1d cp=4" not in text and "1,300.0" not in text, text  # no group of its own; the other class has no peer
    assert "Fold-CP / reference at N=2,048: time 1.50×, peak 1.50×." in text, text
    assert "reference, 1d /" not in text
