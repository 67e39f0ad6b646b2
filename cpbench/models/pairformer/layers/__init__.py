"""The Pairformer's layers, one op family per file; each takes its local shard plus a ``Layout``
and dispatches to the serial, 1d or 2d implementation."""
