"""Run the pinned ``convert_hf_to_gguf.py`` (``python -m ggufmtp.hfconvert.runner LLAMA_CPP_DIR ARGS...``).

The converter and its ``conversion`` package run unmodified, from the pinned llama.cpp tree, with the
pinned gguf-py first on ``sys.path`` (not the ``gguf`` wheel ggufmtp itself depends on). For a checkpoint
that ``synth --format hf`` wrote (and only for one: its config.json carries ``ggufmtp_synth``), two
things are added. (1) The way ``convert_hf_to_gguf_update.py`` adds a tokenizer upstream: the hash of
ggufmtp's synthetic byte-level BPE, declared as the ``qwen2`` pre-tokenizer it is. The converter
identifies BPE tokenizers by that hash and refuses unknown ones, and a synthetic checkpoint cannot
carry a real model's vocabulary; every other tokenizer goes through the converter's own table.
(2) GLM's vocabulary step (``TextModel._set_vocab_glm``) looks up GLM's own control tokens
(``[gMASK]``, ``<|user|>``, ``<|observation|>``), which the synthetic ChatML vocabulary does not
have: a synthetic GLM checkpoint's vocabulary goes through the plain GPT-2 BPE step, as a Qwen
checkpoint's does. A real checkpoint meets the converter unmodified.

A checkpoint ggufmtp TRAINED (:mod:`ggufmtp.train`; its config.json carries ``ggufmtp_trained`` with the
sha256 of its tokenizer.json) has a byte-level BPE learnt from its own corpus, so no fixed table can
know its hash: the hash of its own tokenizer (computed here, on the converter's own probe text) is
declared as ``qwen2``, the pre-tokenizer it was trained with. Only while tokenizer.json is still the
file the trainer recorded: a swapped tokenizer meets the converter's refusal as any unknown one does.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

# sha256 of str(tokenizer.encode(chktxt)) for ggufmtp.synth.hf's tokenizer.json (tests/test_convert.py
# converts a synth checkpoint, so a drift of the synth tokenizer fails there).
EXTRA_PRE_TOKENIZERS = {
    "25cf00c23ff2cc1c2e26cdbc3f6ef35894b308fae34546c24f6b6d40b2dd4bd7": "qwen2",
}


def _register_extra_pre_tokenizers(own: bool = False) -> None:
    """Hashes the converter does not know, declared: :data:`EXTRA_PRE_TOKENIZERS`, and with ``own``
    (a ggufmtp-trained checkpoint) the hash of the checkpoint's own tokenizer, as ``qwen2``."""
    from hashlib import sha256

    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre
    chktxt = None

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            nonlocal chktxt
            chktxt = chktxt or _chktxt(original)
            chkhsh = sha256(str(tokenizer.encode(chktxt)).encode()).hexdigest()
            if own and chkhsh not in EXTRA_PRE_TOKENIZERS:
                EXTRA_PRE_TOKENIZERS[chkhsh] = "qwen2"
                print(f"ggufmtp: trained tokenizer chkhsh {chkhsh} declared as pre-tokenizer qwen2", file=sys.stderr)
            known = EXTRA_PRE_TOKENIZERS.get(chkhsh)
            if known is None:
                raise
            return known

    TextModel.get_vocab_base_pre = get_vocab_base_pre


def _chktxt(fn) -> str:
    """The converter's own probe text (the first string constant of get_vocab_base_pre)."""
    return next(c for c in fn.__code__.co_consts if isinstance(c, str) and "🚀" in c)


def _register_synthetic_glm_vocab() -> None:
    from conversion.base import TextModel

    TextModel._set_vocab_glm = TextModel._set_vocab_gpt2


def _is_synthetic_checkpoint(model_dir: Path) -> bool:
    """A checkpoint ``synth --format hf`` wrote (its config.json says so): only then is the synthetic
    tokenizer's hash added, so a real checkpoint meets the converter exactly as it ships."""
    import json

    try:
        return "ggufmtp_synth" in json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False


def _is_trained_checkpoint(model_dir: Path) -> bool:
    """A checkpoint ggufmtp trained whose tokenizer.json is the one the trainer recorded."""
    import json
    from hashlib import sha256

    try:
        marker = json.loads((model_dir / "config.json").read_text()).get("ggufmtp_trained")
        tokenizer = (model_dir / "tokenizer.json").read_bytes()
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(marker, dict) and marker.get("tokenizer_sha256") == sha256(tokenizer).hexdigest()


def main(argv: list[str]) -> None:
    src = Path(argv[0])
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    if len(argv) > 1 and _is_synthetic_checkpoint(Path(argv[1])):
        _register_extra_pre_tokenizers()
        _register_synthetic_glm_vocab()
    elif len(argv) > 1 and _is_trained_checkpoint(Path(argv[1])):
        _register_extra_pre_tokenizers(own=True)
    sys.argv = [str(src / "convert_hf_to_gguf.py"), *argv[1:]]
    runpy.run_path(str(src / "convert_hf_to_gguf.py"), run_name="__main__")




# ----------------------------------------------------------------------------- audit --source worker


def _expected_bytes(gguf, t, type_name: str):
    """The bytes the converter writes for tensor ``t`` at GGUF type ``type_name`` (gguf-py's own rounding)."""
    import numpy as np

    qtype = gguf.GGMLQuantizationType[type_name]
    data = t.float().numpy()
    if qtype == gguf.GGMLQuantizationType.F32:
        return data.astype(np.float32), data.astype(np.float32).tobytes()
    q = gguf.quants.quantize(data.astype(np.float32), qtype)
    return data.astype(np.float32), q.tobytes()


def _compare(gguf, job: dict, name: str, t, out: list) -> None:
    import numpy as np

    info = job["tensors"].get(name)
    if info is None:
        out.append({"name": name, "match": False, "problem": "converted from the source but absent from the GGUF"})
        return
    info["seen"] = True
    shape = list(reversed(info["shape"]))
    if list(t.shape) != shape and [d for d in t.shape if d != 1] != [d for d in shape if d != 1]:
        out.append({"name": name, "match": False, "problem": f"shape {list(t.shape)} in the source, {shape} in the GGUF"})
        return
    want, want_bytes = _expected_bytes(gguf, t, info["type"])
    raw = np.memmap(job["gguf"], dtype=np.uint8, mode="r", offset=info["offset"], shape=(info["nbytes"],))
    got = gguf.quants.dequantize(np.asarray(raw), gguf.GGMLQuantizationType[info["type"]]).reshape(-1)
    err = float(np.max(np.abs(got.astype(np.float64) - want.reshape(-1).astype(np.float64)))) if got.size else 0.0
    out.append({"name": name, "type": info["type"], "match": bytes(raw) == want_bytes, "max_abs_err": err})


def audit_main(argv: list[str]) -> None:
    """``--audit TREE JOB.json OUT.json``: every source tensor through the converter's own model class
    (name map and value transforms: ``filter_tensors`` + ``modify_tensors``), compared with the GGUF."""
    import json

    src = Path(argv[0])
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    import tempfile

    import gguf
    import torch
    from conversion import get_model_class
    from conversion.base import ModelBase

    job = json.loads(Path(argv[1]).read_text())
    dir_model = Path(job["source_dir"])
    hparams = ModelBase.load_hparams(dir_model, False)
    cls = get_model_class(hparams["architectures"][0])
    out: list = []
    with tempfile.TemporaryDirectory() as tmp:
        model = cls(dir_model, gguf.LlamaFileType.MOSTLY_BF16, Path(tmp) / "unused.gguf", eager=True, dry_run=True)
        trunk = job["trunk_layers"]
        for name, data in model.get_tensors():  # one tensor (one expert group) in memory at a time
            bid = next((int(p) for p in name.split(".") if p.isdecimal()), None)
            if job["only_mtp"] and not (bid is not None and bid >= trunk):
                continue
            if data.dtype not in (torch.float16, torch.float32):
                data = data.to(torch.float32)
            for new_name, t in model.modify_tensors(data, name, bid):
                _compare(gguf, job, new_name, t, out)
    for name, info in job["tensors"].items():
        if not info.get("seen") and (not job["only_mtp"] or info.get("mtp")):
            out.append({"name": name, "match": False, "problem": "in the GGUF but converted from no source tensor"})
    Path(argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--audit"]:
        audit_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
