"""The training loop: :func:`train` takes a preset to two checkpoints (trained head, initial head),
their GGUFs and a record of the run.

Data: the corpus (:mod:`ggufmtp.train.data`) rendered with the chat template, tokenized with the
tokenizer trained on its training split, the training conversations concatenated in an order
shuffled by the seed; each step draws ``batch_size`` random windows of ``seq_len`` tokens from that
stream (a generator seeded by the seed). Held-out loss: every non-overlapping window of the held-out
stream (at most ``eval_batches`` batches); train loss: as many windows at evenly spaced offsets of the
training stream; both at the end, in eval mode, for the trained head and for the same trunk with the
head at its initial weights (the untrained head).

Shown while training: a progress bar (:func:`ggufmtp.progress.bar`: steps, the running LM and MTP
losses, on stderr when it is a terminal); every ``log_every`` steps a line through the
``ggufmtp.train`` logger and into ``train-log.jsonl``.
``train.json`` records the preset, the corpus, the losses, the sizes and the time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ..errors import TrainError
from ..files.fsutil import atomic_write_json, atomic_write_text
from ..jsontypes import JsonObject
from ..progress import bar as progress_bar
from .config import TrainPreset, preset
from .data import Corpus, CorpusSummary, build_corpus, read_corpus
from .export import SHARD_BYTES, TrainMarker, export_checkpoint
from .model import Model, build_model, losses, require_torch
from .tokenizer import TokenizerFiles, load_tokenizer, train_tokenizer

__all__ = ["TrainOptions", "TrainResult", "train", "checkpoint_dir", "TRAINED_GGUF", "INITIAL_GGUF"]

log = logging.getLogger("ggufmtp.train")

TRAINED_GGUF = "model-trained-head-bf16.gguf"  # the converted checkpoint with the trained head
INITIAL_GGUF = "model-initial-head-bf16.gguf"  # the same trunk, the head at its initial weights


def checkpoint_dir(out_dir: Path, preset_name: str, head: str) -> Path:
    """``OUT/qwen35moe-<preset>-<head>-head``: the converter names the GGUF (general.name) after it."""
    return Path(out_dir) / f"qwen35moe-{preset_name}-{head}-head"


@dataclass(frozen=True)
class TrainOptions:
    """How to run a training: ``preset`` (name or :class:`TrainPreset`) into ``out_dir``.

    ``seed``/``steps`` override the preset's; ``corpus_file`` trains on a corpus written by
    :func:`ggufmtp.train.data.write_corpus` instead of building one here (the same data on a
    machine with another Python); ``device`` ``cpu`` or ``cuda``; ``threads`` sets PyTorch's CPU
    threads for the run (None: one on the CPU); ``convert`` converts both checkpoints to BF16 GGUFs with the pinned
    converter (needs the llama.cpp tree; off on a machine that only trains); ``shard_mb`` caps the
    checkpoint's shard size (to carry it in pieces)."""

    out_dir: Path
    preset: str | TrainPreset = "tiny"
    seed: int | None = None
    steps: int | None = None
    corpus_file: Path | None = None
    device: str = "cpu"
    threads: int | None = None
    convert: bool = True
    progress: bool = True
    shard_mb: int | None = None  # checkpoint shards of at most this many MiB (default: 2 GiB)


class LogLine(TypedDict):
    """One logged step (a line of ``train-log.jsonl``, and of ``train.json``'s ``history``)."""

    step: int
    lr: float
    lm_loss: float
    mtp_loss: float
    seconds: float
    tokens_per_second: float


@dataclass
class TrainResult:
    """What :func:`train` made: the checkpoints (and GGUFs), the losses and the time it took."""

    out_dir: Path
    preset: TrainPreset
    key: str
    corpus: CorpusSummary
    checkpoint: Path
    initial_checkpoint: Path
    losses: dict[str, float]
    n_params: dict[str, int]
    vocab_size: int
    tokens_seen: int
    seconds: dict[str, float] = field(default_factory=dict)
    gguf: Path | None = None
    initial_gguf: Path | None = None
    history: list[LogLine] = field(default_factory=list, repr=False)

    def to_dict(self) -> JsonObject:
        return {"out_dir": str(self.out_dir), "preset": self.preset.to_dict(), "key": self.key,
                "corpus": self.corpus, "checkpoint": str(self.checkpoint),
                "initial_checkpoint": str(self.initial_checkpoint), "gguf": str(self.gguf) if self.gguf else None,
                "initial_gguf": str(self.initial_gguf) if self.initial_gguf else None, "losses": self.losses,
                "n_params": self.n_params, "vocab_size": self.vocab_size, "tokens_seen": self.tokens_seen,
                "seconds": self.seconds}


# ----------------------------------------------------------------------------- data


@dataclass
class _Streams:
    train: Any  # 1-D LongTensor
    heldout: Any


def _stream(tokenizer: Any, torch: Any, convs: tuple, seed: int | None) -> Any:
    order = list(range(len(convs)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    encoded = tokenizer.encode_batch([convs[i].render() for i in order])
    return torch.tensor([t for e in encoded for t in e.ids], dtype=torch.long)


def _windows(stream: Any, length: int, count: int, spaced: bool) -> Any:
    """``count`` windows of ``length`` tokens: consecutive from the start, or evenly spaced."""
    n = len(stream) - length
    if n < 0:
        raise TrainError(f"a stream of {len(stream)} tokens has no window of {length}")
    count = max(1, min(count, len(stream) // length))
    starts = [round(i * n / max(1, count - 1)) for i in range(count)] if spaced else [i * length for i in range(count)]
    return stream.unfold(0, length, 1)[starts] if spaced else stream[:count * length].view(count, length)


def _batches(stream: Any, torch: Any, batch: int, length: int, seed: int) -> Iterator[Any]:
    g = torch.Generator().manual_seed(seed)
    windows = stream.unfold(0, length, 1)
    while True:
        yield windows[torch.randint(0, len(windows), (batch,), generator=g)]


# ----------------------------------------------------------------------------- the loop


def _lr(step: int, p: TrainPreset) -> float:
    s = p.schedule
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    t = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def _autocast(torch: Any, device: str, p: TrainPreset) -> Any:
    if p.schedule.precision == "bfloat16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _optimizer(torch: Any, model: Model, p: TrainPreset) -> Any:
    # no weight decay on norms, biases and the (1-D) DeltaNet parameters, as usual
    params = [q for q in model.parameters() if q.requires_grad]
    decay = [q for q in params if q.ndim >= 2]
    rest = [q for q in params if q.ndim < 2]
    s = p.schedule
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=s.lr, betas=s.betas)


def _loop(model: Model, streams: _Streams, p: TrainPreset, device: str, progress: bool,
          log_path: Path) -> list[LogLine]:
    """The optimizer steps; returns the logged history."""
    torch = require_torch()
    s = p.schedule
    opt = _optimizer(torch, model, p)
    batches = _batches(streams.train, torch, s.batch_size, s.seq_len, p.seed)
    history: list[LogLine] = []
    acc = {"lm": 0.0, "mtp": 0.0, "n": 0}
    t0 = time.perf_counter()
    model.train(True)
    with progress_bar(s.steps, f"train {p.name}", "step", enabled=progress) as bar:
        for step in range(s.steps):
            for group in opt.param_groups:
                group["lr"] = _lr(step, p)
            ids = next(batches).to(device)
            with _autocast(torch, device, p):
                lm, steps = losses(model, ids, chain=s.mtp_chain)
            mtp = steps[0]
            loss = lm + s.mtp_loss_weight * sum(steps) / len(steps)
            if not torch.isfinite(loss):
                raise TrainError(f"preset {p.name}: the loss is {loss.item()} at step {step} (diverged; lower lr)")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            acc["lm"] += lm.item()
            acc["mtp"] += mtp.item()
            acc["n"] += 1
            bar.update(1)
            bar.set_postfix(lm=f"{lm.item():.3f}", mtp=f"{mtp.item():.3f}")
            if (step + 1) % s.log_every == 0 or step + 1 == s.steps:
                history.append(_log_line(step + 1, acc, opt, t0, s.batch_size * s.seq_len, log_path))
                acc = {"lm": 0.0, "mtp": 0.0, "n": 0}
    model.train(False)
    return history


def _log_line(step: int, acc: dict, opt: Any, t0: float, tokens_per_step: int, log_path: Path) -> LogLine:
    elapsed = time.perf_counter() - t0
    row: LogLine = {"step": step, "lr": opt.param_groups[0]["lr"], "lm_loss": acc["lm"] / acc["n"],
                    "mtp_loss": acc["mtp"] / acc["n"], "seconds": round(elapsed, 2),
                    "tokens_per_second": round(step * tokens_per_step / max(elapsed, 1e-9))}
    log.info("step %d: lm %.4f  mtp %.4f  lr %.2e  %.0f tok/s", step, row["lm_loss"], row["mtp_loss"], row["lr"],
             row["tokens_per_second"])
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    return row


def _evaluate(model: Model, windows: Any, p: TrainPreset, device: str, head_state: dict | None = None,
              chain: int = 1) -> list[float]:
    """Mean [LM, MTP step 1, ..., MTP step ``chain``] loss over ``windows``, in batches, without gradients."""
    torch = require_torch()
    sums = [0.0] * (1 + chain)
    n = 0
    with torch.no_grad(), _autocast(torch, device, p):
        for i in range(0, len(windows), p.schedule.batch_size):
            ids = windows[i:i + p.schedule.batch_size].to(device)
            lm, steps = losses(model, ids, head_state, chain=chain)
            for j, v in enumerate([lm, *steps]):
                sums[j] += v.item() * len(ids)
            n += len(ids)
    return [v / n for v in sums]


def _final_losses(model: Model, streams: _Streams, p: TrainPreset, device: str) -> dict[str, float]:
    """Train and held-out losses of the trained model, and the untrained head's on the same trunk
    (``*_mtp`` is the first draft step; ``*_mtp_step<k>`` the chained ones, when trained)."""
    s = p.schedule
    count = s.eval_batches * s.batch_size
    held = _windows(streams.heldout, s.seq_len, count, spaced=False)
    seen = _windows(streams.train, s.seq_len, count, spaced=True)
    initial = {k: v.to(device) for k, v in model.initial_head.items()}
    out: dict[str, float] = {}
    for split, windows in (("train", seen), ("heldout", held)):
        lm, *steps = _evaluate(model, windows, p, device, chain=s.mtp_chain)
        out[f"{split}_lm"], out[f"{split}_mtp"] = lm, steps[0]
        out.update({f"{split}_mtp_step{k + 2}": v for k, v in enumerate(steps[1:])})
        out[f"{split}_mtp_initial_head"] = _evaluate(model, windows, p, device, initial)[1]
    out["heldout_windows"] = float(len(held))
    return {k: round(v, 5) for k, v in out.items()}


# ----------------------------------------------------------------------------- the whole run


def _corpus(opts: TrainOptions, p: TrainPreset) -> Corpus:
    return read_corpus(opts.corpus_file) if opts.corpus_file else build_corpus(p.data)


@contextlib.contextmanager
def _torch_settings(torch: Any, threads: int | None) -> Iterator[None]:
    """PyTorch's thread count for the run, transformers' fallback-kernel notices silenced (the
    PyTorch Gated DeltaNet IS the intended path here), both restored afterwards."""
    from transformers.utils import logging as hf_logging

    before, verbosity = torch.get_num_threads(), hf_logging.get_verbosity()
    if threads:
        torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        torch.set_num_threads(before)
        hf_logging.set_verbosity(verbosity)


def _prepare(opts: TrainOptions, p: TrainPreset, torch: Any) -> tuple[Corpus, TokenizerFiles, _Streams]:
    corpus = _corpus(opts, p)
    tok = train_tokenizer(corpus.train, p.tokenizer)
    tokenizer = load_tokenizer(tok)
    streams = _Streams(_stream(tokenizer, torch, corpus.train, p.seed), _stream(tokenizer, torch, corpus.heldout, None))
    if len(streams.heldout) < p.schedule.seq_len:
        raise TrainError(f"the held-out split has {len(streams.heldout)} tokens, fewer than seq_len "
                         f"{p.schedule.seq_len}: raise heldout_fraction or use more modules")
    return corpus, tok, streams


def _marker(p: TrainPreset, key: str, corpus: Corpus, head: str) -> TrainMarker:
    return {"preset": p.name, "key": key, "seed": p.seed, "steps": p.schedule.steps, "data_digest": corpus.digest,
            "head": head}


def _padded_vocab(n: int) -> int:
    return -(-n // 64) * 64  # a multiple of 64, as Qwen pads its vocabulary (the converter adds [PAD] tokens)


def train(opts: TrainOptions) -> TrainResult:
    """Train ``opts.preset`` into ``opts.out_dir``: the two checkpoints (:func:`checkpoint_dir`),
    their GGUFs (``model-trained-head-bf16.gguf``,
    ``model-initial-head-bf16.gguf``, with ``opts.convert``), ``train.json``, ``train-log.jsonl``."""
    torch = require_torch()
    p = preset(opts.preset).with_overrides(seed=opts.seed, steps=opts.steps)
    p.validate()
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    # One thread by default on the CPU: at these widths a second one costs more in synchronisation
    # than it computes (measured: 52 s on one thread, 98 s on two, for the micro preset).
    threads = opts.threads if opts.threads is not None else (1 if opts.device == "cpu" else None)
    with _torch_settings(torch, threads):
        corpus, tok, streams = _prepare(opts, p, torch)
        key = p.key(corpus.digest)
        model = build_model(p.model, _padded_vocab(tok.vocab_size), tok.eos_id, p.seed).to(opts.device)
        times["prepare"] = time.perf_counter() - t0
        log_path = out / "train-log.jsonl"
        atomic_write_text(log_path, "")
        history = _loop(model, streams, p, opts.device, opts.progress, log_path)
        times["train"] = time.perf_counter() - t0 - times["prepare"]
        final = _final_losses(model, streams, p, opts.device)
        times["evaluate"] = time.perf_counter() - t0 - times["prepare"] - times["train"]
    shard = opts.shard_mb * 1024**2 if opts.shard_mb else SHARD_BYTES
    ckpt = export_checkpoint(checkpoint_dir(out, p.name, "trained"), model, p.model, tok,
                             marker=_marker(p, key, corpus, "trained"), shard_bytes=shard)
    initial = export_checkpoint(checkpoint_dir(out, p.name, "initial"), model, p.model, tok,
                                marker=_marker(p, key, corpus, "initial"), head_state=model.initial_head,
                                shard_bytes=shard)
    s = p.schedule
    res = TrainResult(out, p, key, corpus.summary(), ckpt, initial, final, model.n_params(), tok.vocab_size,
                      s.steps * s.batch_size * s.seq_len, history=history)
    if opts.convert:
        res.gguf, res.initial_gguf = _convert_both(res)
    times["total"] = time.perf_counter() - t0
    res.seconds = {k: round(v, 2) for k, v in times.items()}
    atomic_write_json(out / "train.json", {**res.to_dict(), "history": history, "torch": torch.__version__,
                                           "threads": threads or torch.get_num_threads(), "device": opts.device,
                                           "cpu_count": os.cpu_count()})
    return res


def _convert_both(res: TrainResult) -> tuple[Path, Path]:
    """Both checkpoints through ggufmtp's convert path (the pinned converter), as a user runs it; one
    log line each (the converter's own lines only when it fails: they are in the error)."""
    from ..hfconvert.convert import convert

    out = []
    for ckpt, name in ((res.checkpoint, TRAINED_GGUF), (res.initial_checkpoint, INITIAL_GGUF)):
        conv = convert(ckpt, res.out_dir / name, progress=False)
        log.info("converted %s -> %s (%s, MTP %s, %.1f s)", ckpt.name, conv.output.name, conv.architecture,
                 conv.mtp_status, conv.seconds.get("total", 0.0))
        out.append(conv.output)
    return out[0], out[1]
