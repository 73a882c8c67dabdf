"""Test helper: a GGUF rewritten by gguf-py (less some tensors, or split into shards)."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader, GGUFWriter


def copy_gguf(src: Path, dst: Path, drop: frozenset[str] | set[str] = frozenset(), split_max_tensors: int = 0
              ) -> list[Path]:
    """``src`` rewritten at ``dst`` with the source's key order kept, less the tensors in ``drop``;
    with ``split_max_tensors`` as a split GGUF (``split.*`` keys). Its files, first to last."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch="", split_max_tensors=split_max_tensors)
    w.kv_data[0].clear()  # keep the source's key order (the constructor adds general.architecture)
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if not split_max_tensors:
        return [dst]
    return sorted(dst.parent.glob(f"{dst.stem}-*-of-*.gguf"))


def halve_rows(src: Path, dst: Path, min_width: int = 256) -> Path:
    """``src`` rewritten with every row of ``min_width`` or more values cut to its first half (a
    model whose 256-wide rows are 128 wide, 512-wide ones 256). llama-quantize reads names, types and
    shapes, not the widths the hyperparameters imply, so the file quantizes as such a model would."""
    import numpy as np

    from ggufmtp.quant.ggml_types import ggml_types

    dst.parent.mkdir(parents=True, exist_ok=True)
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch="")
    w.kv_data[0].clear()
    for f in r.fields.values():
        if not f.name.startswith("GGUF."):
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        ne = [int(d) for d in t.shape]
        traits = ggml_types()[t.tensor_type.name]
        row_bytes = ne[0] * traits.type_size // traits.block_size
        rows = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1, row_bytes)
        if ne[0] >= min_width:
            ne[0] //= 2
            rows = rows[:, : row_bytes // 2]
        byte_shape = [*reversed(ne[1:]), rows.shape[1]]  # gguf-py takes raw data by its byte shape
        w.add_tensor(t.name, np.ascontiguousarray(rows).reshape(byte_shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
