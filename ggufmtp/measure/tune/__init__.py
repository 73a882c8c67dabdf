"""``ggufmtp tune``: the run (``run``), the search space and successive halving (``search``), the
requests on llama-server (``bench``) and the ranking (``rank``)."""
