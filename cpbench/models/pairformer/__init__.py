"""The reference CP Pairformer trunk (AF3 / Boltz-2): ops, 1d sharding, adapter.

One file per op family (``trimul``, ``triatt``, ``single_att``, ``transition``); each op's
``forward`` takes its local shard plus a ``Layout`` (``layout.py``) and dispatches to the serial
or the sharded implementation. Collectives live in ``comm.py``, chunk sizes in ``chunking.py``,
padding and masks in ``padding.py``. The block is ``block.py``, the trunk ``trunk.py``, the
benchmark adapter ``adapter.py``. Inference then samples structures: the diffusion module
(``diffusion.py``, built from the conditioned blocks of ``conditioned.py`` and the trunk's atom
encoder) and its EDM sampler (``sampler.py``); ``stage_timer.py`` times the step's stages.
"""
