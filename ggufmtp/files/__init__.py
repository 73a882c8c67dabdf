"""Files in general, for every stage: the one atomic writer and safe paths (``fsutil``), sha256 of
large files (``hashing``), the digest cache by file identity (``digest_cache``) and the small on-disk
map under the cache root (``memo``, locked between processes). Nothing here knows GGUF."""
