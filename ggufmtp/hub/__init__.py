"""The Hugging Face Hub: ``pull`` (pull.py; offline and local-directory pulls in local.py, file selection and
digest checks in files.py, the records and manifest in manifest.py) and ``upload`` (upload.py), both over
transport.py (secret scrubbing, error mapping, endpoint and cache)."""
