"""The quantization types of the pinned llama-quantize, as it spells and parses them.

``QUANT_OPTIONS`` is ``tools/quantize/quantize.cpp``'s table at llama.cpp 0c1e570, in its order
(``tests/test_quantize_types.py`` compares it with the pinned source): a name is matched
case-insensitively, or a number is the ftype's value (the first name with that value, as
``try_parse_ftype`` does). ``Q3_K``, ``Q4_K`` and ``Q5_K`` are aliases of the ``_M`` mixes.
"""

from __future__ import annotations

# name as llama-quantize lists it -> the llama_ftype it stands for (as gguf-py names it, less MOSTLY_/ALL_)
QUANT_OPTIONS: dict[str, str] = {
    "Q1_0": "Q1_0", "Q2_0": "Q2_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "MXFP4_MOE": "MXFP4_MOE", "Q5_0": "Q5_0",
    "Q5_1": "Q5_1", "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_S": "IQ2_S", "IQ2_M": "IQ2_M", "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0", "Q2_K": "Q2_K", "Q2_K_S": "Q2_K_S", "IQ3_XXS": "IQ3_XXS",
    "IQ3_S": "IQ3_S", "IQ3_M": "IQ3_M", "Q3_K": "Q3_K_M", "IQ3_XS": "IQ3_XS", "Q3_K_S": "Q3_K_S", "Q3_K_M": "Q3_K_M",
    "Q3_K_L": "Q3_K_L", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "Q4_K": "Q4_K_M", "Q4_K_S": "Q4_K_S",
    "Q4_K_M": "Q4_K_M", "Q5_K": "Q5_K_M", "Q5_K_S": "Q5_K_S", "Q5_K_M": "Q5_K_M", "Q6_K": "Q6_K", "Q8_0": "Q8_0",
    "F16": "F16", "BF16": "BF16", "F32": "F32", "COPY": "COPY",
}

# llama-quantize takes these; ggufmtp refuses them, for this reason
REFUSED_QUANT_OPTIONS: dict[str, str] = {
    "Q2_0": "the pinned gguf-py (0.19.0) cannot read Q2_0 tensors, so ggufmtp could neither plan nor audit the file",
    "COPY": "COPY only copies the tensors (nothing is quantized); ggufmtp has nothing to plan",
}

# llama_ftype values (include/llama.h) for the numeric form; COPY shares F32's 0 and comes after it
_FTYPE_VALUES: dict[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
    "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ2_XXS": 19,
    "IQ2_XS": 20, "Q2_K_S": 21, "IQ3_XS": 22, "IQ3_XXS": 23, "IQ1_S": 24, "IQ4_NL": 25, "IQ3_S": 26, "IQ3_M": 27,
    "IQ2_S": 28, "IQ2_M": 29, "IQ4_XS": 30, "IQ1_M": 31, "BF16": 32, "TQ1_0": 36, "TQ2_0": 37, "MXFP4_MOE": 38,
    "Q1_0": 40, "Q2_0": 41, "COPY": 0,
}

# llama_ftype_get_default_type (src/llama-quant.cpp): the type a ftype's mix starts from
FTYPE_DEFAULT_TYPE = {
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0", "F16": "F16",
    "BF16": "BF16", "F32": "F32", "Q1_0": "Q1_0", "Q2_0": "Q2_0", "MXFP4_MOE": "MXFP4",
    "Q2_K_S": "Q2_K", "Q2_K": "Q2_K", "IQ3_XS": "IQ3_S", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K", "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0", "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_XS", "IQ2_M": "IQ2_S", "IQ3_XXS": "IQ3_XXS", "IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M",
    "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "IQ3_S": "IQ3_S", "IQ3_M": "IQ3_S",
}


def match_quant_option(text: str) -> str | None:
    """The QUANT_OPTIONS name ``text`` selects (``q4_k_m`` -> ``Q4_K_M``, ``q4_k`` -> ``Q4_K``,
    ``15`` -> ``Q4_K``, as llama-quantize resolves it), or None when llama-quantize would not take it."""
    s = str(text).strip()
    for name in QUANT_OPTIONS:
        if name.lower() == s.lower():
            return name
    if s.isdigit():
        return next((name for name, v in _FTYPE_VALUES.items() if v == int(s) and name in QUANT_OPTIONS), None)
    return None


def quant_ftype(text: str) -> str | None:
    """The ftype a llama-quantize type argument stands for (``q4_k`` -> ``Q4_K_M``), or None."""
    name = match_quant_option(text)
    return QUANT_OPTIONS[name] if name else None


def valid_quant_types() -> list[str]:
    """The type names ``ggufmtp quantize`` takes, in llama-quantize's order (its refused ones left out)."""
    return [n for n in QUANT_OPTIONS if n not in REFUSED_QUANT_OPTIONS]


def bits_per_weight(type_name: str) -> float:
    """Bits per weight of a ggml type (``Q4_K``: 4.5, ``Q8_0``: 8.5, ``F32``: 32)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name.upper()]]
    return 8.0 * size / block
