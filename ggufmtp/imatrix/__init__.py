"""Importance matrices: file formats (read/write/convert) and checks (validate/coverage/needs-imatrix)."""
