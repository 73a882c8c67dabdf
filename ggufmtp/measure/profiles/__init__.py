"""How MTP serves on this hardware: ``ggufmtp profiles`` (``run``, ``stream``, ``workloads``: the
serving workloads A-D and their decision table) and ``ggufmtp curve`` (speedup against synthetic
acceptance)."""
