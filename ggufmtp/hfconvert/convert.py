"""``convert``: a safetensors checkpoint (local directory or Hub repo) to a GGUF that keeps its MTP block.

The pinned llama.cpp's own ``convert_hf_to_gguf.py`` does the conversion, with the pinned gguf-py, in
a subprocess (:mod:`ggufmtp.hfconvert.runner`); ggufmtp never converts a tensor itself. Around it:

1. the source is read first (headers only): no ``mtp.*`` tensors is a clear answer before any work,
   and a damaged shard is one error naming it; a Hub repo is checked over HTTP (``remote``) and then
   pulled revision-pinned and checksummed by :func:`ggufmtp.hub.pull.pull`;
2. the converter writes to a staged path next to the output; the staged GGUF is checked with the one
   GGUF reader (MTP status complete, ``block_count`` = trunk + MTP layers, ``nextn_predict_layers`` as
   the source implies) and only then renamed into place, so a converter that drops the MTP block
   silently leaves no output, only an error naming what is missing;
3. ``<output>.source.json`` records the checkpoint's files and sha256s (and repo/commit): the receipt
   of every artifact quantized from the GGUF names them (``base_model.converted_from``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from ..errors import ConvertDependencyError, ConvertError, GgufmtpError
from ..files.fsutil import atomic_write_json
from ..gguf.model import GGUFModel, MTPStatus, check_mtp
from ..jsontypes import JsonObject
from ..provenance.statement import CheckpointFile
from .source import NO_MTP, SOURCE_SUFFIX, SourceCheckpoint, read_checkpoint

__all__ = ["ConvertResult", "convert", "OUTTYPES", "is_hf_checkpoint", "converter_tree", "require_convert_deps",
           "source_record_path"]

OUTTYPES = ("bf16", "f16", "q8_0")
INSTALL_HINT = "pip install 'ggufmtp[convert]' (torch==2.13.0, transformers, sentencepiece)"
# what a pull of a safetensors repo fetches: weights, index, config and tokenizer files
HF_INCLUDE = ["*.safetensors", "*.json", "tokenizer.model", "*.txt", "*.jinja"]


class SourceRecord(TypedDict):
    """The sidecar ``MODEL.gguf.source.json`` (the receipt records it by name, as ``converted_from``)."""

    format: str
    repo_id: str | None
    commit: str | None
    path: str
    converter: str
    outtype: str
    files: list[CheckpointFile]
    upstream: NotRequired[str]  # a local checkpoint's config.json ``_name_or_path``, when it names a Hub repo


@dataclass
class ConvertResult:
    """What :func:`convert` wrote and checked."""

    output: Path
    source: str  # the directory or repo id given
    source_dir: Path
    outtype: str
    architecture: str | None
    block_count: int
    nextn_predict_layers: int
    mtp_status: str
    mtp_layers_in_config: int | None
    source_files: dict[str, str]  # file -> sha256
    repo_id: str | None = None
    commit: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds

    def to_dict(self) -> JsonObject:
        return {"output": str(self.output), "source": self.source, "source_dir": str(self.source_dir),
                "repo_id": self.repo_id, "commit": self.commit, "outtype": self.outtype,
                "architecture": self.architecture, "block_count": self.block_count,
                "nextn_predict_layers": self.nextn_predict_layers, "mtp_status": self.mtp_status,
                "mtp_layers_in_config": self.mtp_layers_in_config, "source_files": self.source_files,
                "seconds": self.seconds}

    def source_record(self) -> SourceRecord:
        """The sidecar's content: what the GGUF was converted from."""
        record: SourceRecord = {
            "format": "safetensors", "repo_id": self.repo_id, "commit": self.commit, "path": str(self.source_dir),
            "converter": "convert_hf_to_gguf.py (pinned llama.cpp)", "outtype": self.outtype,
            "files": [{"path": n, "sha256": d} for n, d in sorted(self.source_files.items())]}
        named = None if self.repo_id else config_repo(self.source_dir)
        if named:  # a local checkpoint saved from a Hub model: the card's base_model (issue #50)
            record["upstream"] = named
        return record


def config_repo(checkpoint: Path) -> str | None:
    """The Hub repo a checkpoint's ``config.json`` names as ``_name_or_path`` (what transformers'
    ``save_pretrained`` writes: the repo it was loaded from), None when it names a local path or nothing."""
    from ..hub.manifest import PulledCard

    try:
        data = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("_name_or_path") if isinstance(data, dict) else None
    if not isinstance(name, str) or name.startswith((".", "/", "~")):  # a local path: no Hub repo
        return None
    card = PulledCard.of({"base_model": name})
    return card.base_model if card else None


def source_record_path(gguf_path: str | os.PathLike) -> Path:
    return Path(str(gguf_path) + SOURCE_SUFFIX)


def is_hf_checkpoint(path: str | os.PathLike) -> bool:
    """A directory with config.json and safetensors weights (what ``run --model`` converts first)."""
    p = Path(path).expanduser()
    return p.is_dir() and (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def require_convert_deps() -> None:
    """The converter imports torch at the top and transformers for tokenizers."""
    import importlib.util

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConvertDependencyError(f"converting safetensors needs {' and '.join(missing)}: {INSTALL_HINT}")


def converter_tree() -> Path:
    """The pinned llama.cpp tree holding convert_hf_to_gguf.py and gguf-py (extracted from the sdist once)."""
    from ..runtime.build import extract_llama_cpp, fetch_sdist

    tree = extract_llama_cpp(fetch_sdist(log=lambda m: print(m, file=sys.stderr)))
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise ConvertError(f"{tree}: no convert_hf_to_gguf.py in the pinned llama.cpp tree")
    return tree


def _run_converter(tree: Path, src: Path, staged: Path, outtype: str, progress: bool) -> None:
    """The pinned converter as a subprocess; its progress lines go to stderr as they come."""
    cmd = [sys.executable, "-m", "ggufmtp.hfconvert.runner", str(tree), str(src), "--outfile", str(staged),
           "--outtype", outtype]
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-12:]
            if progress and (line.startswith("INFO:hf-to-gguf:") or "Writing" in line):
                print(line.rstrip()[-160:], file=sys.stderr, flush=True)
        rc = proc.wait()
    if rc != 0:
        last = next((ln for ln in reversed(tail) if ln.strip()), "")
        raise ConvertError(f"convert_hf_to_gguf.py failed on {src} (exit {rc}): {last[-300:]}")


def check_converted(path: Path, ckpt: SourceCheckpoint) -> GGUFModel:
    """The converted GGUF holds the MTP block the checkpoint has, as many layers as the source implies."""
    model = GGUFModel(path)
    mtp = check_mtp(model)
    want, trunk = ckpt.mtp.layers, ckpt.mtp.trunk_layers
    problems = []
    if mtp.status != MTPStatus.COMPLETE:
        missing = ", ".join(mtp.missing[:6]) or "the whole MTP block"
        problems.append(f"MTP status {mtp.status.value} (missing {missing})")
    if model.nextn_predict_layers != want:
        problems.append(f"nextn_predict_layers {model.nextn_predict_layers}, the source has {want} MTP layer(s)")
    if trunk is not None and model.block_count != trunk + want:
        problems.append(f"block_count {model.block_count}, expected {trunk} trunk + {want} MTP = {trunk + want}")
    if problems:
        raise ConvertError(f"the converter's output lost the MTP block of {ckpt.directory}: "
                           + "; ".join(problems) + " (the output was not written)")
    return model


def _local_source(source: str, revision: str | None, progress: bool, endpoint: str | None,
                  token: str | bool | None) -> tuple[Path, str | None, str | None]:
    """The checkpoint directory: ``source`` itself, or a verified pull of the Hub repo it names."""
    p = Path(os.path.expanduser(source))
    if p.is_dir():
        return p.resolve(), None, None
    from ..hub.pull import check_source_repo, pull
    from .remote import check_remote_mtp

    check_source_repo(source)  # not the Hub client's error inside "reading safetensors headers of"
    head = check_remote_mtp(source, revision=revision, endpoint=endpoint, token=token)
    if not head.mtp.present:
        raise ConvertError(f"{source}: the checkpoint has {NO_MTP} (read from its safetensors headers "
                           f"before downloading): there is no MTP block to keep")
    pulled = pull(source, revision=revision, include=HF_INCLUDE, token=token, progress=progress, endpoint=endpoint)
    return pulled.local_dir, pulled.repo_id, pulled.resolved_commit


def convert(source: str | os.PathLike, output: str | os.PathLike, *, outtype: str = "bf16",
            revision: str | None = None, progress: bool = True, endpoint: str | None = None,
            token: str | bool | None = None) -> ConvertResult:
    """Convert a safetensors checkpoint (directory or Hub repo id) to ``output`` keeping the MTP block.

    Raises :class:`~ggufmtp.errors.ConvertError` when the checkpoint has no MTP tensors, a shard is
    damaged, the converter fails, or its output lost (part of) the MTP block; nothing is left at
    ``output`` then. Without PyTorch/transformers: :class:`~ggufmtp.errors.ConvertDependencyError`."""
    if outtype not in OUTTYPES:
        raise ConvertError(f"--outtype {outtype!r}: must be one of {', '.join(OUTTYPES)}")
    require_convert_deps()
    output = Path(output).expanduser()
    t0 = time.perf_counter()
    src_dir, repo_id, commit = _local_source(str(source), revision, progress, endpoint, token)
    ckpt = read_checkpoint(src_dir)
    if not ckpt.mtp.present:
        raise ConvertError(f"{src_dir}: the checkpoint has {NO_MTP}: there is no MTP block to keep "
                           f"(config {ckpt.mtp.config_key}={ckpt.mtp.layers_in_config})")
    t1 = time.perf_counter()
    tree = converter_tree()
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = output.with_name(f".{output.name}.converting")
    try:
        _run_converter(tree, src_dir, staged, outtype, progress)
        t2 = time.perf_counter()
        model = check_converted(staged, ckpt)
        digests = ckpt.hash_files(progress=progress)
        res = ConvertResult(output, str(source), src_dir, outtype, model.architecture, model.block_count,
                            model.nextn_predict_layers, MTPStatus.COMPLETE.value, ckpt.mtp.layers_in_config,
                            digests, repo_id, commit)
        atomic_write_json(source_record_path(output), res.source_record())
        os.replace(staged, output)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
    t3 = time.perf_counter()
    res.seconds = {"read_source": round(t1 - t0, 3), "converter": round(t2 - t1, 3),
                   "check_and_hash": round(t3 - t2, 3), "total": round(t3 - t0, 3)}
    return res


def hub_safetensors_repo(model: str, token: str | bool | None = None) -> bool:
    """Whether ``model`` (``owner/name[@rev]``, not a local path) is a Hub repo holding a safetensors
    checkpoint and no GGUF (a GGUF repo goes through ``pull`` as before)."""
    repo, _, rev = model.partition("@")
    if Path(os.path.expanduser(model)).exists() or repo.count("/") != 1 or repo.startswith(("/", ".")):
        return False
    from huggingface_hub import HfApi

    from ..hub.transport import guard_secrets, hub_errors, resolve_endpoint

    endpoint = resolve_endpoint(None)
    with guard_secrets(token) as secrets:
        with hub_errors("listing", repo_id=repo, endpoint=endpoint, secrets=secrets, revision=rev or None):
            names = [s.rfilename for s in HfApi(endpoint=endpoint, token=token).model_info(
                repo, revision=rev or None).siblings or []]
    return any(n.endswith(".safetensors") for n in names) and not any(n.endswith(".gguf") for n in names)


def converted_for_run(model: str, out_dir: Path, progress: bool = True,
                      token: str | bool | None = None) -> Path | None:
    """``run --model`` with a safetensors checkpoint (a directory, or a Hub repo pulled revision-pinned
    and verified, its MTP head read from the headers first): the converted BF16 GGUF, converted once
    per set of source file digests (``OUT/converted/<digest>/model-bf16.gguf``); None for anything else."""
    repo, _, rev = model.partition("@")
    try:
        hub = hub_safetensors_repo(model, token)
    except GgufmtpError:  # offline, unreachable, no such repo: the pull stage says so in its own words
        hub = False
    if hub:
        model = str(_local_source(repo, rev or None, progress, None, token)[0])
    if not is_hf_checkpoint(model):
        return None
    import hashlib
    import json

    ckpt = read_checkpoint(model)
    digests = ckpt.hash_files(progress=progress)
    key = hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()[:16]
    target = out_dir / "converted" / key / "model-bf16.gguf"
    record = source_record_path(target)
    if target.is_file() and record.is_file():
        recorded = {f["path"]: f["sha256"] for f in json.loads(record.read_text()).get("files", [])}
        if recorded == digests:
            return target
    if hub:  # the receipt then names the repo and the commit the files came from
        convert(repo, target, revision=rev or None, progress=progress, token=token)
    else:
        convert(ckpt.directory, target, progress=progress)
    return target
