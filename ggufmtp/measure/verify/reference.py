"""verify's reference arm: the reference's MTP head drafting on the artifact's own trunk, in a phase
of its own, and the pairs it gives (:mod:`ggufmtp.provenance.head` judges them).

The question is whether quantizing kept the head, so the reference arm changes only the head: its
server is the MTP arm's exact configuration (the artifact's trunk, window, server arguments, KV
types, context, GPU layers, tuned settings) drafting with the reference's MTP head, an MTP-only
sidecar cut from the reference (:func:`reference_head`: its MTP block, ``token_embd``, ``output_norm``
and ``output`` as they are, ``-md``). Both arms then verify with the same trunk, so at temperature 0
they write the same text, and each (prompt, seed, mode) pairs the two heads' drafts on the same
tokens: the difference is the head's alone. (Serving the whole reference model instead paired two
different texts wherever the quantized trunk's greedy reply diverges: on the trained tiny model its
Q8_0 diverged on 27 of 54 prompts, per-prompt acceptance swung by up to 20 points, and a 3-point
margin needed ~380 prompts; on the same trunk the per-prompt difference of the Q8_0 and BF16 heads
had a standard deviation of 0.75 points; benchmarks/README.md.) What the trunk's precision does to
acceptance is the absolute acceptance and speed findings' to say, not the head's.

Acceptance is a count, not a timing, so the reference arm needs no interleaving with the other arms:
it runs first and alone (:func:`reference_phase`; on a GPU it is never resident beside the artifact's
servers), every (prompt, seed, mode) of the run's budget on the chat endpoint at the shipped window.
Its records are cached by content (:func:`reference_key`: the trunk's and the head's sha256, the
server's flags and environment, the llama.cpp build, the prompts, seeds, reply limit and context
fill), so a rerun with the same settings reuses one measurement; the head is cut once per reference
(cached by its digest under the cache root). The trunk's sha256 is its content
(:func:`~ggufmtp.gguf.trunk.trunk_digest`: every tensor outside the MTP block(s) and the metadata the
server computes with), not the artifact's file: with ``-md`` the artifact's own head is loaded but
never drafts, so the reference arm's counts are the same for every artifact with that trunk, and the
variants of a head-precision ladder (one trunk, the head at Q4_K, Q8_0, BF16) measure it once. The
trunk digest is memoized by the artifact's file digests (``trunks.json`` under the cache root), so a
trunk is read once per artifact. Its drafted and accepted counts are paired with the
artifact's MTP arm by (prompt, seed, mode) (:func:`head_comparison`).

Before anything is served, the reference is bound to the artifact's source
(:func:`~ggufmtp.provenance.binding.bind_reference`): the source named by the artifact's receipt
(given, else ``ARTIFACT.receipt.json`` beside it), or a more precise variant of it whose own receipt
(beside the reference) names that source; never the artifact's bytes. Every file of both, and the
head cut from the reference, is hashed (:class:`~ggufmtp.measure.core.records.ServedSet`) and
checked unchanged after the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ...errors import GgufmtpError, ServerError, VerifyError
from ...files.hashing import sha256_file
from ...files.memo import JsonMemo
from ...gguf.model import SPLIT_RE, GGUFModel
from ...gguf.trunk import TRUNK_DIGEST_VERSION, trunk_digest
from ...progress import bar as progress_bar
from ...provenance.binding import BoundBy, ReferenceBinding, ReferenceFacts, bind_reference, source_digests
from ...provenance.head import HeadComparison, HeadDecision, HeadPair, ReferenceModel, look_schedule
from ...provenance.receipt import Receipt, as_receipt, default_receipt_path
from ...provenance.statement import NamedDigest
from ...runtime.build import binary_version, cache_root, find_binary
from ...runtime.server import LlamaServer, ServerConfig, build_command, flags_without
from ..core.arms import MTP, REFERENCE, send
from ..core.options import VerifyOptions
from ..core.records import ServedFile, ServedSet
from ..core.suite import Suite, modes_for_template
from .kvdepth import fill_context
from .runner import check_drafting, warm_up_arm
from .summary import Record

__all__ = ["ReferenceArm", "ReferencePhase", "ReferencePhaseRecord", "artifact_receipt", "artifact_trunk",
           "check_reference", "check_reference_matches",
           "head_comparison", "head_stop", "reference_key", "reference_phase"]

CACHE_FILE = "references.json"
_CACHE_VERSION = 3  # 2: the reference arm is the reference's head on the artifact's trunk; 3: keyed by the trunk's content
HEADS_DIR = "heads"
TRUNKS_FILE = "trunks.json"  # the trunk digest of each artifact, by its files' sha256


def _receipt_beside(path: Path) -> Path | None:
    """``FILE.receipt.json`` beside ``path`` (a split model's first shard: also the set's
    ``NAME.gguf.receipt.json``, as quantize names it), when there is one."""
    candidates = [default_receipt_path(path)]
    if (m := SPLIT_RE.match(path.name)) is not None:
        candidates.append(path.with_name(f"{m.group('stem')}.gguf.receipt.json"))
    return next((c for c in candidates if c.is_file()), None)


def _describing(path: Path | Receipt, served: ServedSet, what: str) -> Receipt:
    """The receipt at ``path`` (read strictly, unless the command already read it); VerifyError
    unless it is intact and its subjects are exactly the served files' digests."""
    try:
        rf = as_receipt(path)
    except GgufmtpError as e:
        raise VerifyError(f"{what}: {e}") from None
    path = rf.path
    if not rf.intact:
        raise VerifyError(f"{what} {path}: edited after it was written (its integrity digest does not match)")
    if [s.sha256 for s in rf.subjects] != served.digests:
        raise VerifyError(f"{what} {path} describes sha256 {', '.join(s.sha256 for s in rf.subjects)}, not "
                          f"{served.first.path.name}'s bytes (sha256 {', '.join(served.digests)})")
    return rf


def artifact_receipt(path: Path, served: ServedSet, given: str | os.PathLike | Receipt | None) -> Receipt | None:
    """The artifact's receipt, which names its source: ``given`` (a path, or the receipt the command
    read), else the one beside ``path`` (None: a bare GGUF); VerifyError when it does not describe
    the served bytes."""
    found = given if isinstance(given, Receipt) else Path(given) if given is not None else _receipt_beside(path)
    return _describing(found, served, "the artifact's receipt") if found is not None else None


def _facts(path: Path, served: ServedSet, source: frozenset[str] | None) -> ReferenceFacts:
    """What binds the reference: its digests and, unless it is the source itself, its own receipt's."""
    facts = ReferenceFacts(path.name, tuple(served.digests))
    found = _receipt_beside(path)
    if source is None or set(served.digests) == source or found is None:
        return facts
    st = _describing(found, served, "the reference's receipt").statement
    bpw = st["predicate"]["result"].get("bpw")
    return ReferenceFacts(path.name, facts.digests, source_digests(st), sha256_file(found),
                          float(bpw) if bpw is not None else None)


def _existing(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_file():
        raise VerifyError(f"reference {p}: no such file (--reference: the BF16 base or a Q8_0 variant)")
    return p


def check_reference(options: VerifyOptions | None, source_model: str | os.PathLike) -> ReferenceBinding | None:
    """Before anything is quantized (``run``, ``ladder``): the reference ``options`` name (None: none)
    is the source model or a variant of it by its own receipt; VerifyError naming both digests."""
    reference = options.reference if options is not None else None
    if reference is None:
        return None
    _existing(reference)
    source = frozenset(ServedSet.of(source_model).digests)
    served = ServedSet.of(reference)
    return bind_reference(_facts(Path(reference), served, source), source, (), None)


def reference_head(path: Path, served: ServedSet) -> ServedFile:
    """The reference's MTP head as an MTP-only sidecar (:func:`~ggufmtp.quant.sidecar.write_part`: its
    MTP block, ``token_embd``, ``output_norm``, ``output`` and key/values as they are, a split
    reference's shards read in turn), cut once per reference into the cache root
    (``heads/<digest>/mtp-reference.gguf``, staged and renamed into place) and hashed."""
    from ...quant.sidecar import Role, write_part

    folder = cache_root() / HEADS_DIR / hashlib.sha256("\n".join(served.digests).encode()).hexdigest()[:32]
    out = folder / "mtp-reference.gguf"
    if not out.is_file():
        staged = folder / f".mtp-reference.gguf.partial-{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_part(served.first.path, staged, Role.SIDECAR)
            os.replace(staged, out)
        except (OSError, ValueError, GgufmtpError) as e:
            raise VerifyError(f"reference {path.name}: cannot cut its MTP head into {folder}: {e}") from None
        finally:
            staged.unlink(missing_ok=True)
    return ServedFile.of(out)


def _shape(path: Path) -> tuple[str, int, tuple[int, ...]]:
    """What a head must share with the trunk it drafts on: architecture, trunk layers (the MTP
    block's index) and the token embedding's shape (width and vocabulary)."""
    gm = GGUFModel(path)
    embd = gm.tensors.get("token_embd.weight")
    return gm.architecture, gm.trunk_layers, tuple(embd.shape) if embd is not None else ()


def check_head_fits(head: Path, reference: Path, artifact: Path) -> None:
    """VerifyError naming both files unless the reference's head can draft on the artifact's trunk."""
    want, got = _shape(artifact), _shape(head)
    if want != got:
        raise VerifyError(f"reference {reference.name}: its MTP head (architecture {got[0]}, {got[1]} trunk layers, "
                          f"token_embd {list(got[2])}) cannot draft on {artifact.name}'s trunk (architecture "
                          f"{want[0]}, {want[1]} trunk layers, token_embd {list(want[2])}): not the same model")


def artifact_trunk(artifact: ServedSet) -> str:
    """The sha256 of the artifact's trunk's content (:func:`~ggufmtp.gguf.trunk.trunk_digest`, every
    shard), memoized by its files' sha256; VerifyError naming the file when its tensors cannot be read."""
    memo = JsonMemo(cache_root() / TRUNKS_FILE, version=TRUNK_DIGEST_VERSION, max_entries=1024)
    try:
        return trunk_digest(artifact.first.path, artifact.digests, memo)
    except GgufmtpError as e:
        raise VerifyError(f"the artifact's trunk: {e}") from None


@dataclass(frozen=True)
class ReferenceArm:
    """The reference as served: its path, every file's bytes checked before and after the run, what
    binds it to the artifact's source, its MTP head cut as a sidecar (:func:`reference_head`), and the
    digest of the artifact's trunk the head drafts on (:func:`artifact_trunk`)."""

    path: Path
    served: ServedSet
    binding: ReferenceBinding
    head: ServedFile
    trunk: str

    @staticmethod
    def check_path(path: str | os.PathLike, artifact: Path) -> None:
        """VerifyError when the reference is missing or is the artifact itself."""
        p = _existing(path)
        if p.resolve() == artifact.resolve():
            raise VerifyError(f"reference {p}: the artifact itself; a reference is another file (the BF16 base)")

    @classmethod
    def of(cls, path: str | os.PathLike, artifact: ServedSet, receipt: str | os.PathLike | Receipt | None,
           check_model: Callable[[Path], object]) -> ReferenceArm:
        """The reference at ``path``: another file (:meth:`check_path`) that ``check_model`` accepts
        (verify's: a complete MTP block; its error names the reference), hashed (every shard), bound
        to the source named by the artifact's receipt (:func:`artifact_receipt` of ``receipt``), and
        its head cut (:func:`reference_head`) and checked to fit the artifact's trunk."""
        cls.check_path(path, artifact.first.path)
        try:
            check_model(Path(path))
        except VerifyError as e:
            raise VerifyError(f"reference: {e}") from None
        found = artifact_receipt(artifact.first.path, artifact, receipt)
        served = ServedSet.of(path)
        source = source_digests(found.statement) if found is not None else None
        bpw = found.predicate["result"].get("bpw") if found is not None else None
        binding = bind_reference(_facts(Path(path), served, source), source, artifact.digests, bpw)
        head = reference_head(Path(path), served)
        check_head_fits(head.path, Path(path), artifact.first.path)
        return cls(Path(path), served, binding, head, artifact_trunk(artifact))

    def model(self) -> ReferenceModel:
        shards = self.served.shards()
        return ReferenceModel(self.path.name, self.served.first.size, self.served.first.sha256,
                              tuple(shards) if shards else None, self.binding,
                              NamedDigest(name=self.head.path.name, sha256=self.head.sha256))

    def check_unchanged(self) -> None:
        """VerifyError naming the file when the reference or the head cut from it changed."""
        self.served.check_unchanged()
        self.head.check_unchanged()

    def notes(self) -> list[str]:
        """What the reader must know of the reference's binding (an unbound one: not publishable)."""
        if self.binding.by != BoundBy.NONE:
            return []
        return [f"the head was judged against {self.path.name}, but the artifact has no receipt naming its source, so "
                "nothing shows that reference is the model it was made from: the head finding is unbound (a receipt "
                "will not take this verification; verify with the artifact's receipt to publish it)"]


def head_comparison(records: Sequence[Record], ref: ReferenceArm, k: int, margin: float, budget: int,
                    max_tokens: int | None = None) -> HeadComparison:
    """The pairs of the artifact's MTP arm and the reference arm at window ``k`` on the chat endpoint,
    in the order the MTP arm measured them."""
    at = [r for r in records if r.k == k and r.endpoint == "chat"]
    refs = {(r.prompt_id, r.seed, r.mode): r for r in at if r.arm == REFERENCE}
    pairs = tuple(HeadPair(m.prompt_id, m.seed, m.mode, m.draft_n or 0, m.draft_n_accepted or 0,
                           refs[key].draft_n or 0, refs[key].draft_n_accepted or 0)
                  for m in at if m.arm == MTP and (key := (m.prompt_id, m.seed, m.mode)) in refs)
    if not pairs:
        raise VerifyError("the reference arm answered no request of the main comparison")
    return HeadComparison(ref.model(), k, margin, budget, pairs, max_tokens)


def check_reference_matches(ref_records: Sequence[Record], ref_fill: str | None, fill: str | None,
                            modes: list[str]) -> None:
    """The reference phase measured what the main phase measures: the same modes and context fill."""
    if not ref_records:
        return
    ref_modes = list(dict.fromkeys(r.mode for r in ref_records))
    if sorted(ref_modes) != sorted(modes):
        raise VerifyError(f"reference: its chat template gives the modes {ref_modes}, the artifact's {modes}: "
                          "not the same model's template")
    if ref_fill != fill:
        raise VerifyError("reference: its tokenizer gives another context-fill prefix than the artifact's: "
                          "not the same model's tokenizer")


def head_stop(ref: ReferenceArm, records: list[Record], ref_records: Sequence[Record], k: int, margin: float,
              budget: int) -> Callable[[int], bool]:
    """After ``n`` prompts of the main window (``records``: the run's, growing): whether a look of the
    budget's schedule decided the head in every mode (the run then stops; :mod:`ggufmtp.provenance.head`)."""
    looks = set(look_schedule(budget))

    def decided(n: int) -> bool:
        if n not in looks or n >= budget:
            return False
        hc = head_comparison([*records, *ref_records], ref, k, margin, budget)
        return all(f.decision != HeadDecision.INCONCLUSIVE for f in hc.findings().values())
    return decided


def reference_key(ref: ReferenceArm, cfg: ServerConfig, suite: Suite, seeds: Sequence[int], max_tokens: int,
                  depth: int) -> str:
    """What the reference arm's counts depend on, hashed: the trunk's content (not the artifact's file:
    its own head does not draft) and the head's bytes, the server's flags (the model paths left out)
    and environment, the llama.cpp build, the prompts' content, seeds, reply limit, depth."""
    binary = find_binary("llama-server", cfg.llama_cpp_bin)
    payload = {"version": _CACHE_VERSION, "reference": ref.served.digests, "trunk": ref.trunk,
               "head": ref.head.sha256,
               "flags": flags_without(build_command(cfg, "llama-server", 0)), "env": dict(cfg.env or {}),
               "llama.cpp": binary_version(binary), "suite": suite.sha256,
               "prompts": [[p.id, p.category, p.chat_messages()] for p in suite.prompts],
               "seeds": [int(s) for s in seeds], "max_tokens": max_tokens, "depth": depth}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _cache() -> JsonMemo:
    return JsonMemo(cache_root() / CACHE_FILE, version=_CACHE_VERSION, max_entries=64)


class ReferencePhaseRecord(TypedDict):
    """``settings.reference_phase`` of a verification (and ``reference`` of a run's summary)."""

    key: str  # the cache key's first 16 hex digits
    cached: bool
    seconds: float
    requests: int
    trunk: NotRequired[str]  # the trunk digest's first 16 hex digits (absent before the key named the trunk's content)


@dataclass(frozen=True)
class ReferencePhase:
    """What the reference phase gave: its records, its context fill's sha256, the cache key, whether
    the records came from the cache, the phase's wall time here, and the trunk it drafted on."""

    records: list[Record]
    fill: str | None
    key: str
    cached: bool
    seconds: float
    trunk: str = ""

    def to_dict(self) -> ReferencePhaseRecord:
        """The verification's ``settings.reference_phase`` (the records are the run's own): ``trunk``,
        the trunk's digest (its first 16 hex digits), tells which variants share the measurement."""
        return {"key": self.key[:16], "cached": self.cached, "seconds": round(self.seconds, 3),
                "requests": len(self.records), "trunk": self.trunk[:16]}


def reference_phase(ref: ReferenceArm, cfg: ServerConfig | None, suite: Suite, seeds: Sequence[int],
                    max_tokens: int, depth: int, progress: bool) -> ReferencePhase:
    """The reference's records (every prompt x seed x mode of ``suite`` on the chat endpoint at the
    shipped window) from the cache, else measured with its server alone (stopped before this
    returns). Runs that need the same measurement at once (a ladder's workers) wait for one another
    on a lock per key, so it is measured once."""
    assert cfg is not None
    t0 = time.monotonic()
    key = reference_key(ref, cfg, suite, seeds, max_tokens, depth)
    with _key_lock(key):
        cached = _cached(key)
        if cached is not None:
            return ReferencePhase(*cached, key, True, time.monotonic() - t0, ref.trunk)
        records, fill = _measure(cfg, suite, seeds, max_tokens, depth, progress)
        ref.check_unchanged()
        _cache().put(key, {"fill": fill, "records": [dataclasses.asdict(r) for r in records]})
    return ReferencePhase(records, fill, key, False, time.monotonic() - t0, ref.trunk)


@contextlib.contextmanager
def _key_lock(key: str) -> Iterator[None]:
    """An exclusive lock on ``key``'s measurement, between processes (a file system without locks:
    none, and a concurrent run measures again)."""
    folder = cache_root() / "locks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"reference-{key[:32]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _cached(key: str) -> tuple[list[Record], str | None] | None:
    """The cached records of ``key`` (None: none, or an entry that does not read as records)."""
    entry: Any = _cache().get(key)
    try:
        return [Record(**r) for r in entry["records"]], entry["fill"]
    except (TypeError, KeyError):
        return None


def _measure(cfg: ServerConfig, suite: Suite, seeds: Sequence[int], max_tokens: int, depth: int,
             progress: bool) -> tuple[list[Record], str | None]:
    k = int(cfg.draft_n_max or 0)
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(LlamaServer(cfg))
        try:
            modes = modes_for_template(srv.props().get("chat_template"))
        except ServerError as e:
            raise VerifyError(f"reference server: GET /props failed: {e}") from e
        suite, fill = fill_context(suite, srv, depth)
        for mode in modes:
            check_drafting(srv, warm_up_arm(srv, suite.prompts[0], mode, "reference MTP", k), k, "reference MTP")
        jobs = [(p, seed, mode) for p in suite.prompts for seed in seeds for mode in modes]
        bar = stack.enter_context(progress_bar(len(jobs), "reference", "req", enabled=progress))
        records = []
        for order, (p, seed, mode) in enumerate(jobs):
            try:
                reply = send(srv, p, seed, max_tokens, mode, "chat")
            except ServerError as e:
                raise VerifyError(f"reference arm (k={k}) on prompt {p.id!r}, seed {seed}: {e}") from e
            records.append(Record.of(reply, arm=REFERENCE, k=k, endpoint="chat", mode=mode, prompt=p, seed=seed,
                                     order=-1 - order))
            bar.update(1)
    return records, fill.sha256 if fill is not None else None
