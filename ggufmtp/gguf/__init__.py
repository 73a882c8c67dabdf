"""GGUF files: the one reader (on gguf-py's constants), the MTP structure of a model, hashing, atomic writes."""
