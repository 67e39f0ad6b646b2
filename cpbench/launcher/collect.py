"""``python -m cpbench.launcher.collect SWEEP_DIR [--wait]``: the earlier name of
``python -m cpbench.sweep.collect`` (rows for jobs SLURM killed, then the report)."""

import sys

from cpbench.sweep.collect import main

if __name__ == "__main__":
    sys.exit(main())
