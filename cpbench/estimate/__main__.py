"""``python -m cpbench.estimate INPUT [--from DIR] [--gpu-gib G] [--model NAME] [--workflow W] [--json]``.

See ``cpbench.estimate`` for the models. Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from cpbench.estimate import (
    DEFAULT_RESULTS,
    EstimateError,
    as_json,
    estimate,
    load_rows,
    measured_gpu_gib,
    models_text,
    results_line,
    table,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.estimate",
        description="Predicted peak memory per rank, the GPUs it fits, the smallest CP size and the time per "
                    "step for one input, from the result.json files under --from.")
    parser.add_argument("input", help="a Boltz YAML, FASTA (+A3M) or mmCIF/PDB file (as dataset=real reads it)")
    parser.add_argument("--from", dest="results", type=Path, default=None,
                        help=f"directory of result.json files (default: the H200 results committed in a source "
                             f"checkout, {DEFAULT_RESULTS}; an installed package has none)")
    parser.add_argument("--gpu-gib", type=float, default=None,
                        help="GPU memory to check against (default: the GPU the results were measured on)")
    parser.add_argument("--model", default=None, help="only this model (its report label, e.g. boltz2)")
    parser.add_argument("--workflow", default=None, help="only this workflow (inference, inference+sampling, training)")
    parser.add_argument("--json", action="store_true", help="write the answers as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(format="cpbench.estimate: %(message)s")  # a skipped result file: one line on stderr
    try:
        sizes = read_input(args.input)
        rows, points, records = load_rows(args.results)
        gpu_gib = args.gpu_gib or measured_gpu_gib(records)
        answers = estimate(sizes.N, rows, points, gpu_gib, args.model, args.workflow)
    except EstimateError as exc:
        print(f"cpbench.estimate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(as_json(answers, sizes, gpu_gib, args.results or DEFAULT_RESULTS), sys.stdout, indent=2, default=str)
        print()
        return 0
    print(f"{sizes.name}: N={sizes.N:,} tokens, N_atoms={sizes.N_atoms:,}, S={sizes.S:,} MSA rows")
    print(results_line(args.results, records))
    print((f"GPU memory checked: {gpu_gib:g} GiB" if gpu_gib else "GPU memory: unknown (--gpu-gib G)") + "\n")
    print(table(answers, sizes.N, gpu_gib))
    print("\nFitted models (peak: allocated GiB per rank; time: ms per step, median of the slowest rank):")
    print(models_text(answers))
    return 0


def read_input(name: str):
    """The input's sizes, or EstimateError naming the file and what is wrong."""
    from cpbench.data.real import InputError, resolve_input_sizes

    try:
        return resolve_input_sizes({"inputs": name, "ccd": None})
    except InputError as exc:
        raise EstimateError(f"cannot read input: {' '.join(str(exc).split())}") from None
    except Exception as exc:  # noqa: BLE001 - any reader failure is one line, no traceback
        raise EstimateError(f"cannot read input {name}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None


if __name__ == "__main__":
    sys.exit(main())
