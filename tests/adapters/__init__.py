"""Test adapters: small CP workloads that fail on purpose (tests only, never in the package)."""
