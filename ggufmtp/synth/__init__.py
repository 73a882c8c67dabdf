"""The synthetic-model factory (tests, demo, GPU benchmarks)."""
