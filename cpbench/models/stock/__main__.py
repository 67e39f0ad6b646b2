"""``python -m cpbench.models.stock [boltz2 openfold3 protenix]``: import each stock trunk module
(default: all) and say in one line each whether it imports (``packages.main``)."""

import sys

from cpbench.models.stock.packages import main

sys.exit(main(sys.argv[1:]))
