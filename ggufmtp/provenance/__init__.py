"""Provenance: receipts, audit, model cards."""
