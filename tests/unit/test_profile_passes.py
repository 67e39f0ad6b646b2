"""``scripts/profile_ops.py passes``: Nsight Compute's CSV, split at the sentinel kernels into the
block's ops, turned into bytes and passes over z. ncu itself runs on a GPU machine; here its
output format (``--csv --page raw --print-units base``: a header, a units row, one row per kernel,
the program's own lines around them) is fed to the parser."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import profile_ops  # noqa: E402 - the scripts folder first

Z_BYTES = 1_000_000


def ncu_csv(kernels: list[tuple[str, float, float, float]]) -> str:
    cols = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", *profile_ops.NCU_METRICS]
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", "some output of the program",
             ",".join(f'"{c}"' for c in cols),
             ",".join(f'"{u}"' for u in [""] * 11 + ["byte", "byte", "nsecond"])]
    for i, (name, read, written, ns) in enumerate(kernels):
        row = [str(i), "4242", "python3.12", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(64, 1, 1)", "0", "9.0",
               f"{read:,.0f}", f"{written:.0f}", f"{ns:.0f}"]
        lines.append(",".join(f'"{v}"' for v in row))
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines)


def test_kernels_are_split_into_ops_at_the_sentinels():
    sleep = ("spin_kernel(long)", 0.0, 0.0, 1000.0)
    text = ncu_csv([sleep, ("triton_per_fused_layer_norm_0", 1e6, 1e6, 2e5), ("nvjet_gemm", 1e6, 4e6, 3e5),
                    sleep, ("_swiglu_kernel", 1e6, 1e6, 5e5), sleep])
    kernels = profile_ops.parse_ncu_csv(text)
    assert [k["name"] for k in kernels][1:3] == ["triton_per_fused_layer_norm_0", "nvjet_gemm"]
    assert kernels[1]["dram__bytes_read.sum"] == 1e6  # thousands separators read
    out = profile_ops.passes_per_op(kernels, ["tri_mul_out", "pair_transition"], Z_BYTES)
    mul, trans = out["ops"]["tri_mul_out"], out["ops"]["pair_transition"]
    assert mul["kernels"] == 2 and mul["passes"] == 7.0 and mul["kernel_ms"] == 0.5
    assert [k["passes"] for k in mul["by_kernel"]] == [2.0, 5.0]
    assert trans["kernels"] == 1 and trans["passes"] == 2.0
    assert out["block_passes"] == 9.0 and out["z_gb"] == 0.001


def test_a_missing_sentinel_is_an_error_not_a_misattribution():
    sleep = ("spin_kernel(long)", 0.0, 0.0, 1000.0)
    kernels = profile_ops.parse_ncu_csv(ncu_csv([sleep, ("a", 1.0, 1.0, 1.0), ("b", 1.0, 1.0, 1.0)]))
    with pytest.raises(ValueError, match="1 sentinel-delimited groups of kernels for 2 ops"):
        profile_ops.passes_per_op(kernels, ["op1", "op2"], Z_BYTES)


def test_output_without_ncu_csv_says_so():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        profile_ops.parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM - no permission\n")


def test_limits_keep_each_kernels_last_launch_and_rank_its_stalls():
    """``limits``: per kernel name its last launch's pipes and issue slots, the stall reasons largest
    first, those under 0.05 cycles per issue left out."""
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    cols = ["ID", "Kernel Name", "gpu__time_duration.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
            "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
            stall.format("long_scoreboard"), stall.format("wait"), stall.format("drain")]
    rows = [["0", "flex_kernel", "3,000,000", "70.0", "50.0", "0.1", "0.9", "0.01"],
            ["1", "_attention_kernel", "9,000,000", "10.0", "5.0", "0.2", "0.2", "0.0"],
            ["2", "_attention_kernel", "3,400,000", "56.0", "44.0", "1.8", "1.6", "0.02"]]
    text = "\n".join(["some output of the program", ",".join(f'"{c}"' for c in cols),
                      ",".join(['""'] * 2 + ['"nsecond"', '"%"', '"%"', '""', '""', '""']),
                      *(",".join(f'"{v}"' for v in row) for row in rows)])
    flex, mine = profile_ops.kernel_limits(text)
    assert (flex["kernel"], flex["ms"], flex["smsp__issue_active"]) == ("flex_kernel", 3.0, 70.0)
    assert (mine["ms"], mine["sm__inst_executed_pipe_xu"]) == (3.4, 44.0)  # the last launch
    assert list(mine["stalls_per_issue"].items()) == [("long_scoreboard", 1.8), ("wait", 1.6)]
    assert list(flex["stalls_per_issue"]) == ["wait", "long_scoreboard"]
    assert "l2_gb" not in flex  # no byte metrics in this CSV


def test_limits_give_each_kernels_dram_and_l2_bytes_in_gb():
    cols = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "lts__t_bytes.sum"]
    rows = [["0", "_swiglu_kernel", "6,400,000", "1,073,741,824", "1,073,741,824", "25,769,803,776"]]
    text = "\n".join([",".join(f'"{c}"' for c in cols), ",".join(['""'] * 2 + ['"nsecond"'] + ['"byte"'] * 3),
                      *(",".join(f'"{v}"' for v in row) for row in rows)])
    (row,) = profile_ops.kernel_limits(text)
    assert (row["ms"], row["dram_read_gb"], row["dram_write_gb"], row["l2_gb"]) == (6.4, 1.074, 1.074, 25.77)
