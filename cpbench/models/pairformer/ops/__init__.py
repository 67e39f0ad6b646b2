"""Sharded math without parameters (the layers pass their projections in): the triangle
product (1d gather, 2d Cannon), 2d triangle attention (ring with online softmax), 2d attention
with pair bias, and fused attention that returns the log-sum-exp (``sdpa_lse``)."""
