"""Quality of a quantized model: KL-divergence against the BF16 base (``eval``) and the MTP head-precision sweep (``head-sweep``)."""
