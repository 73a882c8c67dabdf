"""From safetensors: convert a Hugging Face checkpoint to GGUF keeping the MTP block, check it, audit it.

Modules, in the order data flows through them:

- ``source``   ``SourceCheckpoint``: a local HF-format directory read (config, index, shards, MTP tensors)
- ``remote``   ``check_remote_mtp``: the same questions answered from the Hub over HTTP, before any download
- ``runner``   the subprocess entry that runs the pinned ``convert_hf_to_gguf.py`` with the pinned gguf-py
- ``convert``  ``convert`` -> ``ConvertResult``: run the converter, check the GGUF, record the source
- ``audit``    ``audit_source``: every MTP tensor (or every tensor) compared with the safetensors it came from
"""
