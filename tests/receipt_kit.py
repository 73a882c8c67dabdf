"""Honest receipts of real GGUF files, made without the llama.cpp runtime (for tests of the audit,
the publish gate and the card that need no quantization): a synthesized GGUF is the artifact, its
receipt is built with the receipt module's own section builders, and a verification record has
exactly the shape ``verify`` writes (:func:`verification_record`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ggufmtp.files.hashing import sha256_file
from ggufmtp.gguf.model import GGUFModel
from ggufmtp.provenance.receipt import _result_section, build_statement, file_entry, seal
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize

TOOLCHAIN = {"ggufmtp": "test", "python": "3.11", "gguf": "0.19.0", "llama_cpp_python": "0.3.36",
             "quantizer": {"library": "libllama via llama-cpp-python", "llama_cpp_commit": "0c1e570",
                           "variant": "cpu", "build_flags": []},
             "server": None, "compiler": None, "cpu_flags": [], "os": "Linux"}


# hifi-q4_k_m-mtp's [verify] table, as verify records it
HIFI_THRESHOLDS = {"min_acceptance": 0.6, "min_speedup": 1.2, "min_identical": 1.0, "enforce_speedup": False,
                   "source": "recipe hifi-q4_k_m-mtp"}


def synth_artifact(folder: Path, name: str = "model-mtp.gguf", seed: int = 0) -> Path:
    """A small real GGUF with a complete MTP block (F32, no runtime needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    return synthesize(folder / name, SynthSpec(seed=seed), progress=False).path


def verification_record(sha256: str, size: int, *, verdict: str = "pass", acceptance: float = 0.9,
                        speedup: float = 1.4, identical: float = 1.0, offloaded: bool = True, n_prompts: int = 54,
                        max_tokens: int = 128, seeds: tuple[int, ...] = (42, 1337, 2024),
                        thresholds: dict[str, Any] | None = None) -> dict[str, Any]:
    """A verification section as ``verify`` writes it, of the file with ``sha256``."""
    th = thresholds if thresholds is not None else dict(HIFI_THRESHOLDS)
    pairs = n_prompts * len(seeds)
    mtp = {"acceptance": acceptance, "acceptance_ci95": [acceptance - 0.02, min(1.0, acceptance + 0.02)],
           "draft_n": 1000, "draft_n_accepted": int(1000 * acceptance), "tokens_per_second": 100.0 * speedup}
    numbers = {"mtp": mtp, "vanilla": {"tokens_per_second": 100.0}, "speedup": speedup,
               "speedup_ci95": [speedup - 0.05, speedup + 0.05], "identical_output_fraction": identical}
    settings = {"draft_n_max": 4, "seeds": list(seeds), "max_tokens": max_tokens, "n_prompts": n_prompts,
                "temperature": 0.0}
    return {"verdict": verdict, "reasons": [], "notes": [],
            "model": {"name": "model-mtp.gguf", "size_bytes": size, "architecture": "qwen35moe", "mtp_block": 4,
                      "file_type": "F32", "sha256": sha256},
            "mode": "default", **copy.deepcopy(numbers),
            "identical_outputs": {"identical": round(identical * pairs), "pairs": pairs},
            "modes": {"default": copy.deepcopy(numbers)},
            "suite": {"name": "chat-v1", "sha256": "4d" * 32, "n_prompts": n_prompts},
            "server": {"build_info": "b1-0c1e570", "binary": "llama-server"},
            "hardware": {"gpu": "NVIDIA H100" if offloaded else None, "offloaded": offloaded, "cpu": "test", "cores": 2},
            "settings": settings, "thresholds": th,
            "evidence": {"prompts": n_prompts, "seeds": len(seeds), "max_tokens": max_tokens},
            "speed_checked": offloaded or bool(th.get("enforce_speedup"))}


def honest_statement(art: Path, verification: dict[str, Any] | None | str = "pass", **figures: Any) -> dict[str, Any]:
    """The sealed receipt statement of ``art`` as it is. ``verification``: "pass" (a passing
    verification of these bytes with ``figures``, see :func:`verification_record`), None, or a
    whole section."""
    gm = GGUFModel(art)
    sha = sha256_file(art)
    predicate: dict[str, Any] = {
        "base_model": {"source": {"type": "builtin", "name": "tiny-qwen35moe"}, "files": [file_entry(art, sha)]},
        "imatrix": None,
        "recipe": {"name": "hifi-q4_k_m-mtp", "file": None, "sha256": None, "ftype": str(gm.file_type), "rules": []},
        "result": _result_section(gm),
        "toolchain": copy.deepcopy(TOOLCHAIN),
        "started_at": "2026-11-25T00:00:00Z", "finished_at": "2026-11-25T00:00:01Z",
        "verification": None,
    }
    st = build_statement([art], predicate, {str(art): sha})
    if verification == "pass":
        st["predicate"]["verification"] = verification_record(sha, art.stat().st_size, **figures)
    elif isinstance(verification, dict):
        st["predicate"]["verification"] = verification
    return seal(st)


def slot_replies(pairs: int, differing: int = 0, batch_size: int = 2, seed: int = 42) -> list[dict[str, Any]]:
    """The per-request records of a slots row (:class:`ggufmtp.provenance.slot_identity.ReplyRecord`):
    ``pairs`` requests p0..p{pairs-1} at ``seed`` sent ``batch_size`` at a time, the last ``differing``
    of them with an MTP reply of its own (no other request's text)."""
    out = []
    for i in range(pairs):
        van = f"{i:064x}"
        mtp = van if i < pairs - differing else f"{i + 10**6:064x}"
        out.append({"prompt": f"p{i}", "seed": seed, "batch": i // batch_size, "vanilla_sha256": van,
                    "mtp_sha256": mtp, "first_difference": None if mtp == van else 3, "text_of": None})
    return out
