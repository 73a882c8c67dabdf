"""Ladders: every variant of one model in one command (``ggufmtp ladder``), on an engine, with one
comparison card. :mod:`.spec` (what to make), :mod:`.engine` (where it runs), :mod:`.run` (the
shared stages, the variants, the card, the upload)."""
