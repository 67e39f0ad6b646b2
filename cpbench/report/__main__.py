"""CLI: ``python -m cpbench.report DIR [--out PATH] [--baseline-max-n N] [--peak-tflops T]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpbench.report import build_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpbench.report",
                                     description="Aggregate every result.json under DIR into cp_benchmark.md/.csv and plots.")
    parser.add_argument("dir", type=Path, help="a sweep directory (or any folder holding result.json files)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here (CSV and plots beside it)")
    parser.add_argument("--baseline-max-n", type=int, default=None, help="a single-GPU max N to compare against")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per-GPU peak TFLOP/s for MFU")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"cpbench.report: error: {args.dir}: not a directory", file=sys.stderr)
        return 2
    written = build_report(args.dir, out=args.out, baseline_max_n=args.baseline_max_n, peak_tflops=args.peak_tflops)
    for key in ("markdown", "csv", "out_markdown", "out_csv"):
        if key in written:
            print(f"{key}: {written[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
