"""The two routines a sweep point runs over the harness: ``probe`` (the max-N search) and
``timing`` (warmup, repeats, median of the slowest rank)."""
