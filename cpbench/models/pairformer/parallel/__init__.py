"""Who holds what and how it moves: layouts, the 2d grid, collectives, transposes, the Cannon
ring, chunk budgets, padding. No ``nn.Module`` here; ops and layers only call it.

Imports flow: ``grid`` -> ``layout`` -> ``comm`` -> ``p2p`` -> ``transpose``, ``ring``
(``chunking`` and ``padding`` stand alone).
"""
