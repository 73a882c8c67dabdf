"""Quantization: recipes, the plan (pre-flight and dry run) and quantize."""
