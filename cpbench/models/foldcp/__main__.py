"""``python -m cpbench.models.foldcp``: import Fold-CP's trunk and say in one line whether it imports
(version, commit, whether a 1D trunk is there) (``package.main``)."""

import sys

from cpbench.models.foldcp.package import main

sys.exit(main())
