"""``ggufmtp verify``: the verification run (``run``), its statistics (``summary``) and report, the
slot study (``slots``), KV-cache types and context depth (``kvdepth``), and ``verify --matrix``."""
