"""Does a Hub checkpoint carry an MTP head? Answered before any download (``pull --check-mtp``).

``huggingface_hub``'s ``get_safetensors_metadata`` reads only the safetensors headers (HTTP Range
requests on each shard, or the ``model.safetensors.index.json``), and ``config.json`` is one small
file: together they say whether ``mtp.*`` tensors exist, how many MTP layers there are (config or
inferred from the names, like the pinned converter), and their names, dtypes and shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ConvertError
from ..jsontypes import JsonObject
from .source import NO_MTP, MTPHead, SourceTensor, mtp_head

__all__ = ["RemoteMTPCheck", "check_remote_mtp"]


@dataclass
class RemoteMTPCheck:
    """The MTP head of a Hub checkpoint, read from headers only."""

    repo_id: str
    revision: str | None
    commit: str | None
    architecture: str | None
    n_tensors: int
    shards: list[str]
    mtp: MTPHead

    def to_dict(self) -> JsonObject:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
                "architecture": self.architecture, "n_tensors": self.n_tensors, "shards": self.shards,
                "has_mtp": self.mtp.present, "mtp": self.mtp.to_dict()}

    def summary(self) -> str:
        at = f" @ {self.commit}" if self.commit else ""
        head = f"{self.repo_id}{at}: {self.architecture or 'unknown architecture'}, {self.n_tensors} tensors " \
               f"in {len(self.shards)} safetensors file(s)"
        if not self.mtp.present:
            return head + f"\n  MTP: none ({NO_MTP}): a conversion has no MTP block to keep"
        key = self.mtp.config_key
        cfg = (f"config {key}={self.mtp.layers_in_config}" if self.mtp.layers_in_config
               else f"config omits {key}: inferred from the tensor names")
        lines = [head, f"  MTP: {self.mtp.layers} layer(s), {len(self.mtp.tensors)} tensors ({cfg})"]
        lines += [f"    {t.name:<56} {t.dtype:<5} {list(t.shape)}" for t in self.mtp.tensors]
        return "\n".join(lines)


def _tensors(meta: Any) -> list[SourceTensor]:
    return [SourceTensor(name, info.dtype, tuple(info.shape), fname)
            for fname, fm in sorted(meta.files_metadata.items()) for name, info in fm.tensors.items()]


def check_remote_mtp(repo_id: str, *, revision: str | None = None, endpoint: str | None = None,
                     token: str | bool | None = None) -> RemoteMTPCheck:
    """Read ``repo_id``'s config.json and safetensors headers (pinned to one commit) and report its MTP head."""
    from huggingface_hub import HfApi, hf_hub_download

    from ..hub.transport import guard_secrets, hub_errors, resolve_endpoint

    endpoint = resolve_endpoint(endpoint)
    with guard_secrets(token) as secrets:
        with hub_errors("reading safetensors headers of", repo_id=repo_id, endpoint=endpoint, secrets=secrets,
                        revision=revision):
            api = HfApi(endpoint=endpoint, token=token)
            commit = api.model_info(repo_id, revision=revision).sha
            meta = api.get_safetensors_metadata(repo_id, revision=commit)
            cfg_path = hf_hub_download(repo_id, "config.json", revision=commit, endpoint=endpoint, token=token)
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as e:
        raise ConvertError(f"{repo_id}: config.json is not readable JSON ({e})") from None
    tensors = _tensors(meta)
    archs = config.get("architectures") or [None]
    return RemoteMTPCheck(repo_id, revision, commit, archs[0], len(tensors), sorted(meta.files_metadata),
                          mtp_head(config, tensors))
