"""The reference CP Pairformer trunk (AF3 / Boltz-2) and its benchmark adapter.

Imports flow one way: ``parallel`` -> ``ops`` -> ``layers`` -> ``modules`` -> ``adapter``.

* ``parallel/``: who holds what and how it moves, no ``nn.Module``: the ``Layout`` (serial,
  1d rows, 2d tiles) and its ``Grid``, collectives with byte counting (``comm``), pair
  transposes (``transpose``), point-to-point moves (``p2p``) and the Cannon ring (``ring``),
  chunk budgets (``chunking``), padding and masks (``padding``).
* ``ops/``: sharded math without parameters: the triangle product (1d and 2d), 2d triangle
  attention, 2d attention with pair bias, fused attention with log-sum-exp (``sdpa_lse``).
* ``layers/``: one op family per file (triangle multiplication and attention, single
  attention, transitions, MSA ops, conditioned diffusion layers, the embedder, atom windows);
  each ``forward`` takes its local shard plus a ``Layout`` and dispatches to the serial or the
  sharded implementation.
* ``modules/``: assembled modules: the Pairformer block, the MSA module, the atom encoder, the
  trunk, the diffusion module and its EDM sampler.
* ``adapter.py``: the benchmark adapter (``cpbench/conf/model/pairformer.yaml``); ``stage_timer.py``
  times the step's stages; ``flops.py`` counts the block's FLOPs for the report's MFU.
"""
