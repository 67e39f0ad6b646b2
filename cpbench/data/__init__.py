"""Input data: synthetic features by the AF3/Boltz inventory, their sharding, and real inputs.

* ``make_synthetic_features`` / ``FEATURE_SPEC`` (``synthetic.py``): global seeded features.
* ``pad_features`` / ``shard_features`` (``sharding.py``): per-rank padding and slicing.
* ``resolve_input_sizes`` (``real.py``): (name, N, N_atoms, S) of a real input file.
"""

from cpbench.data.real import InputError, InputSizes, resolve_input_sizes
from cpbench.data.sharding import PaddedLayout, pad_features, shard_features, units_for_mesh
from cpbench.data.synthetic import FEATURE_SPEC, make_synthetic_features

__all__ = [
    "FEATURE_SPEC", "InputError", "InputSizes", "PaddedLayout", "make_synthetic_features",
    "pad_features", "resolve_input_sizes", "shard_features", "units_for_mesh",
]
