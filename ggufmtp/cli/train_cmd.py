"""ggufmtp train (a Qwen3.5/3.6-MoE-layout model and its MTP head, trained jointly; both heads converted)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from ..train.config import PRESETS
from .app import emit_json, handle_errors, json_option, main
from .options import SharedOption


@main.command("train")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path), required=False)
@click.option("--preset", "preset_name", type=click.Choice(list(PRESETS)), default="tiny", show_default=True,
              help="Model, tokenizer, data and schedule (tiny = builtin:tiny-qwen35moe-trained; gpu-* for an accelerator).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Optimizer steps (default: the preset's).")
@click.option("--seed", type=int, default=None, help="Seed of the weights, data order and batches (default: the preset's).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="PyTorch device: cpu or cuda.")
@click.option("--torch-threads", "--threads", "torch_threads", cls=SharedOption, hidden=("--threads",),
              type=click.IntRange(min=1), default=None,
              help="PyTorch CPU threads (default: 1 on the CPU, faster at these widths).")
@click.option("--corpus", "corpus_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Train on this corpus file (written by --write-corpus) instead of this Python's standard library.")
@click.option("--write-corpus", "write_corpus_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Only write the preset's corpus (JSONL) to this file, and exit: carry it to another machine.")
@click.option("--no-convert", is_flag=True, help="Only the safetensors checkpoints (a machine without the llama.cpp tree).")
@click.option("--shard-mb", type=click.IntRange(min=1), default=None,
              help="Checkpoint shards of at most this many MiB (default 2048).")
@json_option
@handle_errors
def train_cmd(out_dir: Path | None, preset_name: str, steps: int | None, seed: int | None, device: str, torch_threads: int | None,
              corpus_file: Path | None, write_corpus_to: Path | None, no_convert: bool, shard_mb: int | None,
              as_json: bool) -> None:
    """Train a Qwen3.6-layout MoE model with an MTP head that learns its job; convert both heads.

    The trunk is transformers' Qwen3.5-MoE (Gated DeltaNet and full attention, routed and shared
    experts), the head Qwen3.6's mtp.* block reading the trunk's post-norm hidden state (what
    llama.cpp feeds it); trained jointly (LM loss + 0.3 x MTP loss) on chat turns made from this
    Python's standard library, with a byte-level BPE trained on them. OUT_DIR receives the
    checkpoint in the published layout, the same trunk with the head at its initial weights, both
    converted to BF16 GGUF with the pinned converter, train.json and train-log.jsonl. With
    --write-corpus only the preset's corpus is written (OUT_DIR may then be left out)."""
    if write_corpus_to is not None:
        from ..train.data import build_corpus, write_corpus

        corpus = build_corpus(PRESETS[preset_name].data)
        write_corpus(corpus, write_corpus_to)
        if as_json:
            emit_json({"corpus": str(write_corpus_to), **corpus.summary()})
        else:
            click.echo(f"wrote {write_corpus_to}: {len(corpus.train)} train, {len(corpus.heldout)} held-out "
                       f"conversations, digest {corpus.digest[:12]}")
        return
    if out_dir is None:
        raise click.UsageError("OUT_DIR is required (only --write-corpus runs without one)")
    from ..train.trainer import TrainOptions, train

    if not as_json:
        _log_to_stderr()
    res = train(TrainOptions(out_dir=out_dir, preset=preset_name, seed=seed, steps=steps, corpus_file=corpus_file,
                             device=device, threads=torch_threads, convert=not no_convert, progress=not as_json,
                             shard_mb=shard_mb))
    if as_json:
        emit_json(res.to_dict())
        return
    loss = res.losses
    click.echo(f"trained {res.preset.name} ({res.n_params['total']:,} parameters, {res.tokens_seen:,} tokens) "
               f"in {res.seconds['train']:.0f} s")
    click.echo(f"  held-out loss: LM {loss['heldout_lm']:.3f}, MTP {loss['heldout_mtp']:.3f} "
               f"(initial head {loss['heldout_mtp_initial_head']:.3f}); train: LM {loss['train_lm']:.3f}, "
               f"MTP {loss['train_mtp']:.3f}")
    click.echo(f"  checkpoints: {res.checkpoint}, {res.initial_checkpoint}")
    if res.gguf:
        click.echo(f"  GGUF: {res.gguf} (initial head: {res.initial_gguf})")
    click.echo(f"  record: {res.out_dir / 'train.json'}")


class _AboveTheBar(logging.Handler):
    """Loss lines printed above the progress bar (tqdm.write), not through it."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


def _log_to_stderr() -> None:
    logger = logging.getLogger("ggufmtp.train")
    if not any(isinstance(h, _AboveTheBar) for h in logger.handlers):
        logger.addHandler(_AboveTheBar())
    logger.setLevel(logging.INFO)
