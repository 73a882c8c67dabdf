"""Measurement with llama-server, by concept: ``core`` (suites, statistics, the paired-arm runner,
options, records), then ``verify`` (the verification, its report, slots, KV depth, the matrix),
``tune`` (the settings search) and ``profiles`` (serving profiles and the acceptance curve); each
sub-package imports only from those before it in that order."""
