"""Measurement with llama-server: suites, statistics, the paired-arm runner, verify, tune, curve, profiles."""
