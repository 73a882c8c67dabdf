"""The receipt's JSON as types: the in-toto statement and the predicate's sections, as
``ggufmtp/data/receipt.schema.json`` describes them (:mod:`.receipt` writes and reads them).

They are ``TypedDict``: the receipt is a JSON document, so its shape stays a dict (the bytes
written are those of the dicts), and these name its keys and their types for the code that builds
and reads it. A receipt written by an older ggufmtp may lack a key that is optional here
(``total=False``); readers keep their ``.get``. The ``verification`` section is written by
:mod:`ggufmtp.measure` (``VerifyResult.to_receipt()``, then tune, curve, profiles and ``verify
--matrix`` add theirs); :class:`Verification` names the keys ggufmtp reads back (cards, audit,
verdict), not every key written. :class:`PullManifest` is what a receipt reads of a Hub pull.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, Protocol, Required, TypedDict

from ..runtime.hardware import Bandwidth
from .search_card import SearchRecord

__all__ = ["PullManifest", "FileEntry", "SubjectEntry", "Source", "ConvertedFrom", "BaseModelSection", "ImatrixSection",
           "RecipeSection", "ResultSection", "Toolchain", "Verification", "QualitySection", "HeadSweepSection", "SourceSection",
           "Predicate", "Statement", "Envelope"]


# ----------------------------------------------------------------------------- subject and inputs


class PulledFileDigest(Protocol):
    @property
    def path(self) -> str: ...  # inside the repo, POSIX separators

    @property
    def sha256(self) -> str: ...


class PullManifest(Protocol):
    """What a receipt records of a Hub pull (:class:`ggufmtp.hub.manifest.PullResult` is one)."""

    @property
    def repo_id(self) -> str | None: ...

    @property
    def requested_revision(self) -> str | None: ...

    @property
    def resolved_commit(self) -> str | None: ...

    @property
    def files(self) -> Sequence[PulledFileDigest]: ...

    @property
    def card(self) -> PulledCardFacts | None: ...


class PulledCardFacts(Protocol):
    """What the pulled repo's model card says (:class:`ggufmtp.hub.manifest.PulledCard` is one)."""

    @property
    def base_model(self) -> str | None: ...

    @property
    def license(self) -> str | None: ...


class FileEntry(TypedDict):
    """An input file: name, size and sha256."""

    name: str
    size: int
    sha256: str


class Digest(TypedDict):
    sha256: str


class Annotations(TypedDict):
    size: int


class SubjectEntry(TypedDict):
    """An artifact file the statement is about."""

    name: str
    digest: Digest
    annotations: Annotations


class Source(TypedDict, total=False):
    """Where the base model came from: a Hub repo at a commit, a builtin, or a local file by name."""

    type: Required[str]  # hub | local | builtin
    repo_id: str | None
    revision: str | None
    commit: str | None
    name: str
    license: str
    upstream: str  # the model the pulled repo's card names as its base_model (PulledCard)


class CheckpointFile(TypedDict):
    path: str  # the file's name in the checkpoint
    sha256: str


class ConvertedFrom(TypedDict, total=False):
    """The checkpoint a converted GGUF came from: its sidecar (``MODEL.source.json``), the folder by name."""

    format: str
    repo_id: str | None
    commit: str | None
    name: str
    converter: str
    outtype: str
    files: list[CheckpointFile]
    upstream: str  # a local checkpoint's config.json ``_name_or_path`` naming a Hub repo


class BaseModelSection(TypedDict):
    source: Source
    files: list[FileEntry]
    converted_from: NotRequired[ConvertedFrom]


class ImatrixCorpus(TypedDict):
    name: str
    sha256: str
    bytes: int


class ImatrixComputed(TypedDict):
    """How ``ggufmtp imatrix compute`` made the imatrix (its provenance record)."""

    corpus: ImatrixCorpus
    chunks: int
    ctx_size: int
    runtime_commit: str
    mtp: bool
    mtp_entries: int


class ImatrixSection(TypedDict):
    file: str
    sha256: str
    format: str  # dat | gguf
    datasets: list[str]
    chunk_count: int | None
    entries: int
    missing: list[str]
    computed: ImatrixComputed | None


class RecipeRule(TypedDict):
    pattern: str
    type: str
    source: str


class RecipeSection(TypedDict):
    name: str
    file: str | None
    sha256: str | None
    ftype: str
    output_type: str | None
    token_embedding_type: str | None
    rules: list[RecipeRule]
    llama_quantize_command: str
    search: NotRequired[SearchRecord]  # a searched recipe's [search] record (provenance/search_card.py)


class SplitSection(TypedDict):
    """A split artifact (``--split-max-size``): the subjects are its ``count`` shards in order, the
    first the file a server is given; written by ``tool`` with shards of at most ``max_size``."""

    count: int
    max_size: str
    tool: str


class ResultSection(TypedDict):
    """What the artifact's GGUF says (``mtp_blocks`` is missing from receipts older than chains;
    ``split`` is present only for a split artifact)."""

    tensor_types: dict[str, str]
    tensor_types_sha256: str
    mtp_block: int | None
    mtp_blocks: NotRequired[list[int]]
    mtp_status: str
    nextn_predict_layers: int | None
    file_type: str | None
    size_bytes: int
    n_params: int
    bpw: float
    split: NotRequired[SplitSection]


class Quantizer(TypedDict):
    library: str
    llama_cpp_commit: str
    variant: str | None
    build_flags: list[str]
    pinned_commit: NotRequired[str]


class ServerSection(TypedDict, total=False):
    """The llama-server a verification ran (``build_info`` is its ``--version``)."""

    build_info: str | None
    binary: str | None
    commit: str | None


class Toolchain(TypedDict):
    ggufmtp: str
    python: str
    gguf: str | None
    llama_cpp_python: str | None
    quantizer: Quantizer
    server: ServerSection | None
    compiler: str | None
    cpu_flags: list[str]
    os: str


# ----------------------------------------------------------------------------- verification


class ArmSection(TypedDict, total=False):
    """One arm's figures (the MTP arm has the drafting ones)."""

    acceptance: float | None
    acceptance_ci95: list[float] | None
    tokens_per_second: float | None
    mean_acceptance_length: float | None
    tokens_per_step: float | None
    acceptance_by_position: list[float] | None
    server_args: list[str]
    server_env: dict[str, str]  # the environment the arm's server ran with (e.g. GGML_CUDA_GRAPH_OPT)


class CategoryFigures(TypedDict, total=False):
    acceptance: float | None
    acceptance_ci95: list[float] | None
    tokens_per_second: float | None
    speedup: float | None
    speedup_ci95: list[float] | None


class SweepRow(CategoryFigures, total=False):
    k: int


class VerifySettings(TypedDict, total=False):
    seeds: list[int]
    n_prompts: int
    max_tokens: int
    draft_n_max: int | None
    draft_n_min: int | None
    mtp_flags: list[str]
    mtp_env: dict[str, str]
    mtp_config: dict[str, object] | None  # the tuned configuration the MTP arm ran (TuneConfig.to_dict)
    prompt_ids: list[str]  # the prompts measured (absent in older receipts)


class ThresholdsSection(TypedDict, total=False):
    min_acceptance: float | None
    min_speedup: float | None
    min_identical: float
    enforce_speedup: bool
    source: str


class HardwareSection(TypedDict, total=False):
    """``HardwareInfo.to_dict()`` (``cores`` and ``cpu_model`` as older receipts have them)."""

    cpu: str | None
    cpu_model: str | None
    cores: int | None
    gpu: str | None
    gpus: list[Any]
    offloaded: bool


class SuiteSection(TypedDict, total=False):
    name: str
    n_prompts: int


class NamedDigest(TypedDict):
    name: str
    sha256: str


class ServedModel(TypedDict, total=False):
    sha256: str | None
    name: str
    sidecar: NamedDigest  # the MTP-only sidecar the MTP arm drafted with (verify --sidecar)


class IdenticalOutputs(TypedDict, total=False):
    identical: int
    pairs: int


class MismatchEntry(TypedDict, total=False):
    """One differing reply (``verification.mismatches[]``); the numerics fields from
    :mod:`ggufmtp.measure.verify.divergence` (absent in older receipts)."""

    prompt_id: str
    seed: int
    mode: str
    endpoint: str
    k: int
    first_difference_at: int
    vanilla: str
    mtp: str
    vanilla_tokens: int
    mtp_tokens: int
    token_index: int | None
    margin_nats: float | None
    batched_flip: bool | None
    vanilla_token: str | None
    mtp_token: str | None
    runner_up_token: str | None
    batched_token: str | None
    vanilla_token_id: int | None
    mtp_token_id: int | None
    runner_up_token_id: int | None
    batched_token_id: int | None
    explained: bool | None
    unexplained_why: str | None


class ProfileRef(TypedDict, total=False):
    """The file ``verify --tuned-from`` read the profile from: its name (never a path) and sha256,
    and whether the search there recommended MTP (None: the file does not say)."""

    name: str
    sha256: str
    search_recommended: bool | None


class TunedSection(TypedDict, total=False):
    """``verification.tuned``: the server settings the card recommends (:mod:`.tuned`)."""

    kind: str | None
    command: str
    mtp_command: str | None
    vanilla_command: str | None
    recommended: str | None
    recommended_config: dict[str, object] | None
    best: str | None
    best_config: dict[str, object] | None
    speedup: float | None
    speedup_ci95: list[float] | None
    acceptance: float | None
    best_speedup: float | None  # verify --sweep's (its best window's)
    best_speedup_ci95: list[float] | None
    mtp_beats_vanilla: bool
    why: str
    rule: str
    hardware: HardwareSection
    profile: ProfileRef  # only verify --tuned-from's: the profile verified on these bytes
    search: TunedSection | None  # verify --tuned-from's: the search's section it replaced (tune --receipt's)


class CurvePoint(CategoryFigures, total=False):
    tokens_per_step: float | None


class CurveSection(TypedDict, total=False):
    draft_n_max: int
    points: list[CurvePoint]
    breakeven_acceptance: float | None


class DecisionRow(TypedDict, total=False):
    workload: str
    title: str
    shape: str
    vanilla_tokens_per_second: float | None
    mtp_tokens_per_second: float | None
    mtp_helps: str
    reasoning: str


class ProfilesSection(TypedDict, total=False):
    decision_table: list[DecisionRow]


class MatrixCell(CategoryFigures, total=False):
    kv_type: str | None
    depth: int
    mean_acceptance_length: float | None
    identical_output_fraction: float | None
    verdict: str


class MatrixSection(TypedDict, total=False):
    cells: list[MatrixCell]


class Verification(TypedDict, total=False):
    """The keys of ``predicate.verification`` that ggufmtp reads back."""

    verdict: str
    reasons: list[str]
    speed_checked: bool
    mtp: ArmSection
    vanilla: ArmSection
    default_vanilla: ArmSection
    speedup: float | None
    speedup_ci95: list[float] | None
    speedup_vs_default_vanilla: float | None
    speedup_vs_default_vanilla_ci95: list[float] | None
    identical_output_fraction: float | None
    identical_outputs: IdenticalOutputs
    mismatches: list[MismatchEntry]
    numerics_drift_nats: float | None
    numerics_positions: int
    numerics_flips: int
    thresholds: ThresholdsSection
    settings: VerifySettings
    hardware: HardwareSection
    suite: SuiteSection
    model: ServedModel
    server: ServerSection
    per_category: dict[str, CategoryFigures]
    per_seed: dict[str, CategoryFigures]
    sweep: list[SweepRow] | None
    tuned: TunedSection | None
    findings: dict[str, str] | None
    bandwidth: Bandwidth | None
    acceptance_curve: CurveSection | None
    profiles: ProfilesSection | None
    matrix: MatrixSection | None


# ----------------------------------------------------------------------------- sections other stages add


class QualityCorpus(TypedDict, total=False):
    name: str


class QualitySection(TypedDict, total=False):
    """``ggufmtp eval``'s section (``QualityResult.to_dict()``), as the cards read it."""

    corpus: QualityCorpus
    chunks: int
    ctx_size: int
    commit: str
    ppl: float | None
    ppl_err: float | None
    ppl_base: float | None
    ppl_base_err: float | None
    kld_mean: float | None
    kld_mean_err: float | None
    kld_p99_9: float | None
    same_top_p: float | None


class HeadSweepRow(CategoryFigures, total=False):
    head_type: str
    head_bytes: int
    size_bytes: int
    mean_acceptance_length: float | None


class HeadSweepSection(TypedDict, total=False):
    variants: list[HeadSweepRow]
    recommended: str | None


class TensorMatchEntry(TypedDict, total=False):
    name: Required[str]
    match: Required[bool]
    type: str
    max_abs_err: float
    problem: str


class SourceSection(TypedDict):
    """``receipt add-source``: the artifact's tensors against the safetensors checkpoint
    (``SourceAudit.to_section()``), bound to the artifact's digest."""

    format: str
    name: str
    repo_id: str | None
    revision: str | None
    scope: str  # mtp | all
    ok: bool
    files: list[CheckpointFile]
    tensors: list[TensorMatchEntry]
    artifact_sha256: str


class Integrity(TypedDict):
    sha256: str


class PairSection(TypedDict):
    """A file of a split model (``ggufmtp sidecar``, :mod:`ggufmtp.provenance.pair`): its role, the
    full model it was split from, the base model's file digests (what every trunk of the model
    comes from) and the other file written with it."""

    role: str  # sidecar | trunk
    made_from: NamedDigest
    source_sha256: list[str]
    trunk: NamedDigest | None
    sidecar: NamedDigest | None


class Predicate(TypedDict):
    base_model: BaseModelSection
    imatrix: ImatrixSection | None
    recipe: RecipeSection
    result: ResultSection
    toolchain: Toolchain
    started_at: str
    finished_at: str
    verification: Verification | None
    integrity: NotRequired[Integrity]  # set by ``seal``
    quality: NotRequired[QualitySection]
    head_sweep: NotRequired[HeadSweepSection]
    source: NotRequired[SourceSection]
    pair: NotRequired[PairSection]


class Statement(TypedDict):
    """An in-toto Statement v1 with the ggufmtp receipt predicate."""

    _type: str
    subject: list[SubjectEntry]
    predicateType: str
    predicate: Predicate


class Signature(TypedDict):
    keyid: str
    sig: str


class Envelope(TypedDict):
    """A DSSE envelope around a statement (:mod:`.signing`)."""

    payload: str
    payloadType: str
    signatures: list[Signature]
