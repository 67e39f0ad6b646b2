"""CLI: ``python -m cpbench.report DIR [--out PATH] [--baseline-max-n N] [--peak-tflops T] [--readme README.md]``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cpbench.report import build_report
from cpbench.report.readme import README_END, README_START


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpbench.report",
                                     description="Aggregate every result.json under DIR into cp_benchmark.md/.csv and plots.")
    parser.add_argument("dir", type=Path, help="a sweep directory (or any folder holding result.json files)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also copy the report here (CSV and plots beside it); default: DIR only")
    parser.add_argument("--baseline-max-n", type=int, default=None, help="a single-GPU max N to compare against")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per-GPU peak TFLOP/s for MFU")
    parser.add_argument("--readme", type=Path, default=None,
                        help="replace the block between <!-- headline:start --> and <!-- headline:end --> here "
                             "with the headline (max N per configuration)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="cpbench.report: %(message)s")  # a skipped file: one line on stderr
    if not args.dir.is_dir():
        print(f"cpbench.report: error: {args.dir}: not a directory", file=sys.stderr)
        return 2
    if args.readme is not None and not args.readme.is_file():
        print(f"cpbench.report: error: {args.readme}: not a file", file=sys.stderr)
        return 2
    written = build_report(args.dir, out=args.out, baseline_max_n=args.baseline_max_n, peak_tflops=args.peak_tflops,
                           readme=args.readme)
    for key in ("markdown", "csv", "out_markdown", "out_csv", "readme"):
        if key in written:
            print(f"{key}: {written[key]}")
    if args.readme is not None and "readme" not in written:
        print(f"cpbench.report: warning: {args.readme} has no {README_START} ... {README_END} markers; left unchanged",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
