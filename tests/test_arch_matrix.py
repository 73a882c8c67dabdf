"""Every command on every architecture the synthesizer writes with an MTP block (issue #21): the
README's architecture table (``tools/gen_arch_table.py``) is this file's outcome, cell by cell.

One test per (architecture, stage), parametrized over ``arch_names()`` restricted to the
architectures llama.cpp has an MTP graph for (a new arch module is covered without an edit):

- ``inspect``   the synthetic model's MTP block(s) are complete
- ``imatrix``   ``compute_imatrix(..., mtp=True)``: llama-imatrix plus the MTP collector's statistics
- ``plan``      the libllama dry run with its pre-flight checks (an IQ recipe without imatrix is refused)
- ``quantize``  each shipped recipe (``recipes/*.toml``), then llama-server serves the artifact with
                ``--spec-type draft-mtp``: replies are exactly the bigram chain and (drafted, accepted)
                exactly the replay of the server's draft loop (:func:`simulate_acceptance`)
- ``audit``     the run's artifact against its receipt; one flipped byte fails it
- ``verify``    ``ggufmtp run``'s verify stage (vanilla vs draft-mtp): acceptance equals the knob's
                prediction on the suite's prompts, every output identical, verdict pass
- ``receipt``   signed (DSSE + ARTIFACT.sig, checked with the public key) and unsigned receipts
- ``card``      the model card names the head(s), the digest and the draft-mtp command
- ``hub``       upload through the local test Hub, pull back: same bytes, MTP complete

Each architecture's models and artifacts are made once per module, on first use, by
:class:`ArchArtifacts`; a step that fails raises the same error for every test that needs it.
Where the pinned llama.cpp cannot do a stage, :data:`PINNED` says so: the test then asserts that
exact failure (an upgrade that fixes it fails the test, so the pin is revisited) and the README
cell reads ``xfail: <reason>``. A model of an architecture without an MTP graph (``llama``) with
an MTP recipe is one clear error naming the architectures that have one.

Kept cheap for CI (2 cores): tiny 4-layer models, 3 prompts x 32 tokens, one seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client, write_keypair

import ggufmtp
from ggufmtp.cli import main
from ggufmtp.constants import MTP_ARCHITECTURES
from ggufmtp.errors import GgufmtpError, PlanError, SynthError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.gguf.model import GGUFModel
from ggufmtp.imatrix.compute import ComputeResult
from ggufmtp.imatrix.format import read_imatrix
from ggufmtp.measure.core.suite import load_suite
from ggufmtp.pipeline import RunResult
from ggufmtp.provenance.card import UNVERIFIED_HEADING
from ggufmtp.provenance.receipt import load_receipt, read_receipt, receipt_for_quantize, schema_errors
from ggufmtp.provenance.signing import verify_artifact, verify_receipt
from ggufmtp.provenance.verdict import Evidence
from ggufmtp.quant.quantize import QuantizeResult
from ggufmtp.quant.recipe import Recipe
from ggufmtp.runtime.server import LlamaServer, ServerConfig, require_drafting
from ggufmtp.synth.archs.registry import arch_names
from ggufmtp.synth.calibrate import chat_last_tokens
from ggufmtp.synth.chain import predict_tokens, simulate_acceptance, suite_acceptance
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.tokenizer import build_vocab

ROOT = Path(__file__).resolve().parent.parent
RECIPES = tuple(sorted(p.stem for p in (ROOT / "recipes").glob("*.toml")))
MTP_ARCHS = tuple(a for a in arch_names() if a in MTP_ARCHITECTURES)
NO_MTP_ARCHS = tuple(a for a in arch_names() if a not in MTP_ARCHITECTURES)
PIPELINE_RECIPE = "hifi-q4_k_m-mtp"  # the flagship: ggufmtp run drives audit, verify, receipt, card with it
WRONG = 0.1  # wrong-successor fraction: acceptance ~0.8 at k=4 (above every recipe's minimum), visibly < 1
# the least a publishable verification measures (#28: Evidence), so the hub cell publishes a verified artifact
N_PROMPTS, MAX_TOKENS = Evidence.MIN_PROMPTS, Evidence.MIN_MAX_TOKENS
# One thread per llama.cpp process: ggml's workers spin at each graph barrier, and on a busy 2-core
# machine two of them can stall a tiny model's request 20x; one thread is as fast when idle.
THREADS = 1
VERIFY = {"seeds": (42,), "limit": N_PROMPTS, "max_tokens": MAX_TOKENS, "threads": THREADS, "ctx_size": 1024}
SERVE_K = 3  # draft window of the per-recipe serving check
TOKEN = "hf_archMatrixTOKEN"
IMATRIX = {"chunks": 2, "ctx_size": 128, "threads": THREADS}


@dataclasses.dataclass(frozen=True)
class Pinned:
    """What the pinned llama.cpp does instead of a stage: the README cell's reason (with the
    upstream issue, when there is one) and the error the test asserts."""

    reason: str
    error: type[BaseException]
    match: str


#: (architecture, stage) -> the pinned failure.
PINNED: dict[tuple[str, str], Pinned] = {
    # deepseek4: serves and drafts; llama-imatrix's rules leave hyper-connection-shaped tensors without statistics
    ("deepseek4", "imatrix --mtp"): Pinned(
        "no statistics for nextn.eh_proj: graph_mtp multiplies it with a [2*n_embd, 4 hyper-connection copies, "
        "n_tokens] activation (src/models/deepseek4.cpp:1417), and llama-imatrix's small-batch rule "
        "(src1->ne[1] < 16, tools/imatrix/imatrix.cpp:249), which the MTP collector keeps, skips it",
        AssertionError, r"\d+ == \d+ and False"),  # the head's entries are counted right; none is eh_proj
    **{("deepseek4", stage): Pinned(
        "IQ2_XXS needs an imatrix for output_hc_fn (llama-imatrix collects blk.* only, tools/imatrix/imatrix.cpp:250) "
        "and the attn/indexer_compressor_ape tables (read by get_rows, src/models/deepseek4.cpp:953): llama-quantize "
        "throws 'Missing importance matrix' (src/llama-quant.cpp:1303)",
        err, match)
       for stage, err, match in (
           ("plan", AssertionError, r"planned as a type that needs an imatrix, but"),  # pytest truncates the rest
           ("quantize iq2_xxs-mtp", PlanError, r"needs an imatrix, but .* has no statistics for them: output_hc_fn"))},
}


def _arch_params() -> list[Any]:
    return [pytest.param(a, id=a) for a in MTP_ARCHS]


def _recipe_params() -> list[Any]:
    return [pytest.param(a, r, id=f"{a}-{r}") for a in MTP_ARCHS for r in RECIPES]


# ----------------------------------------------------------------------------- one architecture's artifacts


class ArchArtifacts:
    """One architecture's synthetic model and everything made from it, each made once on first use;
    a failure is kept and raised again for every later test that needs the same thing."""

    def __init__(self, arch: str, root: Path, synth_model: Callable[[SynthSpec], Path], keys: dict[str, Path]):
        self.arch, self.root, self.keys = arch, root, keys
        self.spec = SynthSpec(arch=arch, wrong_successor_fraction=WRONG)
        self._synth = synth_model
        self._made: dict[str, Any] = {}

    def _once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._made:
            try:
                self._made[key] = make()
            except Exception as e:  # noqa: BLE001 - kept, and raised again for each test that needs it
                self._made[key] = e
        got = self._made[key]
        if isinstance(got, Exception):
            raise got
        return got

    @property
    def base(self) -> Path:
        return self._once("base", lambda: self._synth(self.spec))

    def imatrix_with_mtp(self) -> ComputeResult:
        return self._once("imatrix-mtp", lambda: ggufmtp.compute_imatrix(
            self.base, "builtin:calib-v1", self.root / "imatrix-mtp.gguf", mtp=True, **IMATRIX))

    def imatrix(self) -> Path:
        """The MTP imatrix; where the MTP collector cannot run, llama-imatrix's trunk-only one
        (enough for the shipped recipes: none gives the MTP block an IQ type that needs statistics)."""
        def make() -> Path:
            try:
                return self.imatrix_with_mtp().path
            except GgufmtpError:
                return ggufmtp.compute_imatrix(self.base, "builtin:calib-v1", self.root / "imatrix.gguf",
                                               **IMATRIX).path

        return self._once("imatrix", make)

    def quantized(self, recipe: str) -> QuantizeResult:
        return self._once(f"quantize {recipe}", lambda: ggufmtp.quantize(
            self.base, recipe, self.root / f"{recipe}.gguf", imatrix=self.imatrix(), quantize_threads=2, progress=False))

    def _run(self, verify: bool) -> RunResult:
        options = ggufmtp.RunOptions(imatrix=self.imatrix(), verify=verify,
                                     verify_options=ggufmtp.VerifyOptions.from_dict(VERIFY), quantize_threads=2,
                                     signing_key=self.keys["priv"])
        return ggufmtp.run(str(self.base), PIPELINE_RECIPE, options,
                           out_dir=self.root / ("verified" if verify else "unverified"), progress=False)

    def pipeline(self) -> RunResult:
        """``ggufmtp run --no-verify`` (signed): audit, receipt and card without llama-server."""
        return self._once("pipeline", lambda: self._run(verify=False))

    def verified(self) -> RunResult:
        """``ggufmtp run`` with verify, in its own folder (so the unverified run's card and receipt
        stay as they were, whatever order the tests run in)."""
        return self._once("verified", lambda: self._run(verify=True))


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    priv, pub = write_keypair(tmp_path_factory.mktemp("keys"))
    return {"priv": priv, "pub": pub}


@pytest.fixture(scope="module")
def made(synth_model, keys, tmp_path_factory) -> Callable[[str], ArchArtifacts]:
    cache: dict[str, ArchArtifacts] = {}

    def get(arch: str) -> ArchArtifacts:
        if arch not in cache:
            cache[arch] = ArchArtifacts(arch, tmp_path_factory.mktemp(arch), synth_model, keys)
        return cache[arch]

    return get


@pytest.fixture(scope="module")
def last_tokens(llama_server_bin) -> list[int]:
    """The last token of each verify prompt's generation prompt (every synthetic model has the same
    tokenizer and chat template): where each reply's bigram chain starts."""
    prompts = load_suite().limit(N_PROMPTS).prompts
    return chat_last_tokens([p.chat_messages() for p in prompts], threads=THREADS)


@pytest.fixture
def cell(record_property) -> Callable[[str, str], contextlib.AbstractContextManager[None]]:
    """``with cell(arch, stage):`` around a test's body: records which README cell the test is
    (junit properties, read by tools/gen_arch_table.py) and, for a pinned stage, asserts the pinned
    failure instead of success."""
    @contextlib.contextmanager
    def enter(arch: str, stage: str, table: str = "mtp") -> Iterator[None]:
        record_property("arch", arch)
        record_property("stage", stage)
        record_property("table", table)
        pin = PINNED.get((arch, stage))
        if pin is None:
            yield
            return
        record_property("pinned", pin.reason)
        with pytest.raises(pin.error, match=pin.match):
            yield

    return enter


def _mtp_prefixes(spec: SynthSpec) -> tuple[str, ...]:
    return tuple(f"blk.{b}." for b in spec.mtp_blocks)


# ----------------------------------------------------------------------------- inspect, imatrix, plan


@pytest.mark.parametrize("arch", _arch_params())
def test_inspect(arch, made, cell):
    with cell(arch, "inspect"):
        m = made(arch)
        rep = ggufmtp.inspect(m.base)
        assert rep.architecture == arch and rep.mtp_status == "complete", rep.mtp_problems
        assert rep.mtp_blocks == m.spec.mtp_blocks and rep.nextn_predict_layers == m.spec.n_mtp_blocks
        assert rep.trunk_layers == m.spec.layers and rep.mtp_missing == []


@pytest.mark.parametrize("arch", _arch_params())
def test_imatrix(arch, made, cell):
    with cell(arch, "imatrix --mtp"):
        m = made(arch)
        res = m.imatrix_with_mtp()
        assert res.provenance.mtp and res.provenance.mtp_entries > 0
        entries = set(read_imatrix(res.path).entries)
        head = {e for e in entries if e.startswith(_mtp_prefixes(m.spec))}
        assert len(head) == res.provenance.mtp_entries and any(".nextn.eh_proj." in e for e in head), head
        assert entries - head, "no trunk statistics"


@pytest.mark.parametrize("arch", _arch_params())
def test_plan(arch, made, cell):
    """Pre-flight: IQ2_XXS without an imatrix is refused before any work; with one, every MTP tensor
    is planned and flagged, eh_proj at the recipe's type; the CLI agrees."""
    with cell(arch, "plan"):
        m = made(arch)
        refused = ggufmtp.plan(m.base, "iq2_xxs-mtp")
        assert refused.errors and "requires an imatrix" in refused.errors[0]
        p = ggufmtp.plan(m.base, "iq2_xxs-mtp", m.imatrix())
        assert p.ok, p.errors
        s = p.mtp_summary()
        assert s.status == "complete" and s.block == m.spec.mtp_blocks[0] and s.eh_proj == "Q8_0"
        base_head = [n for n in GGUFModel(m.base).tensors if n.startswith(_mtp_prefixes(m.spec))]
        assert s.tensors == len(base_head) > 3
        r = CliRunner().invoke(main, ["plan", str(m.base), "-r", "iq2_xxs-mtp", "--imatrix", str(m.imatrix())])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output


# ----------------------------------------------------------------------------- quantize with every recipe


def _serve_check(spec: SynthSpec, model: Path, last: list[int]) -> tuple[int, int]:
    """llama-server with draft-mtp on ``model``: every reply is the bigram chain, and the draft
    counts are the replay's; returns (drafted, accepted)."""
    vocab, d, a = build_vocab(), 0, 0
    cfg = ServerConfig(model=model, draft_mtp=True, draft_n_max=SERVE_K, threads=THREADS, ctx_size=1024)
    with LlamaServer(cfg) as srv:
        for p, t in zip(load_suite().limit(N_PROMPTS).prompts, last):
            r = srv.chat(p.chat_messages(), max_tokens=MAX_TOKENS)
            assert r["choices"][0]["message"]["content"] == vocab.decode(predict_tokens(spec, t, MAX_TOKENS)), p.id
            got = require_drafting(r)
            assert got == simulate_acceptance(spec, t, MAX_TOKENS, SERVE_K), (p.id, got)
            d, a = d + got[0], a + got[1]
    return d, a


@pytest.mark.parametrize("arch,recipe", _recipe_params())
def test_quantize(arch, recipe, made, last_tokens, cell):
    with cell(arch, f"quantize {recipe}"):
        m = made(arch)
        res = m.quantized(recipe)
        assert all(c.ok for c in res.checks), [c for c in res.checks if not c.ok]
        s = res.plan.mtp_summary()
        assert s.status == "complete" and list(s.blocks or [s.block]) == m.spec.mtp_blocks
        want = dict(Recipe.load(recipe).mtp_roles).get("eh_proj")
        assert want is None or s.eh_proj == want
        assert ggufmtp.inspect(res.output).mtp_status == "complete"
        d, a = _serve_check(m.spec, res.output, last_tokens)
        assert 0 < a < d  # the knob's wrong successors are drafted, and rejected


# ----------------------------------------------------------------------------- run: audit, verify, receipt, card


def _flip_byte(path: Path, tensor: str) -> None:
    """Flip the low bit of one byte inside ``tensor``'s data (size and structure unchanged)."""
    off = GGUFModel(path).tensor_data_offsets[tensor] + 64
    with path.open("r+b") as f:
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([b ^ 0x01]))


@pytest.mark.parametrize("arch", _arch_params())
def test_audit(arch, made, cell, tmp_path):
    with cell(arch, "audit"):
        m = made(arch)
        run = m.pipeline()
        assert {s.stage for s in run.stages} >= {"plan", "quantize", "audit", "receipt", "card"}
        rep = ggufmtp.audit(run.artifact, run.receipt)
        assert rep.ok, [c for c in rep.checks if not c.ok]
        tampered = tmp_path / run.artifact.name
        shutil.copy(run.artifact, tampered)
        _flip_byte(tampered, f"blk.{m.spec.mtp_blocks[0]}.nextn.eh_proj.weight")
        failed = [c.name for c in ggufmtp.audit(tampered, run.receipt).checks if not c.ok]
        assert failed == [f"sha256 {tampered.name}"], failed


@pytest.mark.parametrize("arch", _arch_params())
def test_verify(arch, made, last_tokens, cell):
    """Verify's numbers are llama-server's, and exactly what the knob predicts: (drafted, accepted)
    over the suite equals the replay of the draft loop on each prompt's chain."""
    with cell(arch, "verify"):
        m = made(arch)
        run = m.verified()
        assert run.stage("verify") is not None and not run.stage("verify").cached
        v = load_receipt(run.receipt)["predicate"]["verification"]
        assert v["verdict"] == "pass", v["reasons"]
        assert v["identical_output_fraction"] == 1.0 and v["mismatch_count"] == 0
        k = Recipe.load(PIPELINE_RECIPE).verify.draft_n_max
        want = suite_acceptance(m.spec, last_tokens, MAX_TOKENS, k)
        assert (v["mtp"]["draft_n"], v["mtp"]["draft_n_accepted"]) == tuple(want)
        assert v["mtp"]["acceptance"] == pytest.approx(want[1] / want[0], abs=1e-12) and want[1] < want[0]
        card = run.card.read_text()
        assert UNVERIFIED_HEADING not in card and f"{100 * v['mtp']['acceptance']:.1f}%" in card


@pytest.mark.parametrize("arch", _arch_params())
def test_receipt(arch, made, keys, cell, tmp_path):
    """Signed: the run's receipt (DSSE) and artifact (ARTIFACT.sig) check with the public key.
    Unsigned: a plain receipt of a quantize result, valid and audited."""
    with cell(arch, "receipt"):
        m = made(arch)
        run = m.pipeline()
        st = load_receipt(run.receipt)
        assert schema_errors(st) == [] and read_receipt(run.receipt).signed
        verify_receipt(run.receipt, keys["pub"])
        verify_artifact(run.artifact, keys["pub"])
        res = st["predicate"]["result"]
        assert res["mtp_status"] == "complete" and res["mtp_block"] == m.spec.mtp_blocks[0]
        assert st["subject"][0]["digest"]["sha256"] == sha256_file(run.artifact)
        q = m.quantized("q8_0-mtp")
        plain = receipt_for_quantize(q, imatrix=m.imatrix(), receipt_path=tmp_path / "plain.receipt.json")
        assert not read_receipt(plain).signed and schema_errors(load_receipt(plain)) == []
        assert ggufmtp.audit(q.output, plain).ok


@pytest.mark.parametrize("arch", _arch_params())
def test_card(arch, made, cell):
    with cell(arch, "card"):
        m = made(arch)
        run = m.pipeline()
        text = run.card.read_text()
        front, body = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S).groups()
        meta = yaml.safe_load(front)
        assert {"gguf", "mtp", "speculative-decoding"} <= set(meta["tags"])
        assert all(f"`blk.{b}`" in body for b in m.spec.mtp_blocks)
        assert load_receipt(run.receipt)["subject"][0]["digest"]["sha256"] in body
        assert "--spec-type draft-mtp" in body and UNVERIFIED_HEADING in body  # not verified yet: it says so


@pytest.mark.parametrize("arch", _arch_params())
def test_hub(arch, made, cell, tmp_path, monkeypatch):
    """The verified artifact, its receipt and card go up in one commit to the local Hub and come
    back pinned to that commit: the same bytes (the receipt's sha256), MTP complete, audit ok."""
    with cell(arch, "hub"):
        m = made(arch)
        run = m.verified()
        isolate_hf_client(tmp_path / "hf_home", monkeypatch)
        monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
        with FakeHub(tokens=(TOKEN,)) as fake:
            digest = load_receipt(run.receipt)["subject"][0]["digest"]["sha256"]
            options = ggufmtp.UploadOptions(token=TOKEN, endpoint=fake.url, recipe_name=PIPELINE_RECIPE,
                                            artifact_sha256=digest)
            up = ggufmtp.upload(f"me/{arch}-mtp", [run.artifact], [run.receipt], run.card, options, progress=False)
            got = ggufmtp.pull(f"me/{arch}-mtp", local_dir=tmp_path / "dl", token=TOKEN, endpoint=fake.url,
                               progress=False)
        assert got.resolved_commit == up.commit_sha and got.verified
        assert got.model_path is not None and sha256_file(got.model_path) == digest
        assert ggufmtp.inspect(got.model_path).mtp_status == "complete"
        assert ggufmtp.audit(got.model_path, got.local_dir / run.receipt.name).ok


# ----------------------------------------------------------------------------- architectures without an MTP graph


def _no_mtp_params() -> list[Any]:
    return [pytest.param(a, id=a) for a in NO_MTP_ARCHS]


@pytest.mark.parametrize("arch", _no_mtp_params())
def test_no_mtp_arch_synth_refuses_the_block(arch, cell, synth_model):
    """Without an MTP graph, synth refuses the block (llama: no checkpoint has one); where real
    checkpoints ship one that the pinned llama.cpp cannot draft with (glm5-next: its graph throws
    'not implemented yet'), synth writes it as the converter does and inspect says it cannot draft."""
    with cell(arch, "synth with MTP", table="no-mtp"):
        SynthSpec(arch=arch, mtp=False).validate()
        try:
            SynthSpec(arch=arch).validate()
        except SynthError as e:
            assert f"arch {arch} has no MTP" in str(e)
            return
        rep = ggufmtp.inspect(synth_model(SynthSpec(arch=arch)))
        assert rep.mtp_status != "complete" and rep.mtp_blocks, rep
        assert any(f"architecture {arch} has no MTP draft graph" in p for p in rep.mtp_problems), rep.mtp_problems


@pytest.mark.parametrize("arch", _no_mtp_params())
def test_no_mtp_arch_plan_is_one_clear_error(arch, synth_model, cell, tmp_path):
    """An MTP recipe on it: one error naming the architecture and every one that has an MTP graph,
    from the API (plan's errors, quantize's PlanError, nothing written) and the CLI (one error line,
    no traceback)."""
    with cell(arch, "MTP recipe refused", table="no-mtp"):
        model = synth_model(SynthSpec(arch=arch, mtp=False))
        errors = ggufmtp.plan(model, PIPELINE_RECIPE).errors
        assert len(errors) == 1 and _names_the_mtp_archs(errors[0], arch), errors
        with pytest.raises(PlanError) as ei:
            ggufmtp.quantize(model, PIPELINE_RECIPE, tmp_path / "q.gguf", progress=False)
        assert _names_the_mtp_archs(str(ei.value), arch) and not (tmp_path / "q.gguf").exists()
        r = CliRunner().invoke(main, ["plan", str(model), "-r", PIPELINE_RECIPE])
        said = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert len(said) == 1 and _names_the_mtp_archs(said[0], arch), r.output


def _names_the_mtp_archs(message: str, arch: str) -> bool:
    return f"architecture {arch} " in message and all(a in message for a in MTP_ARCHITECTURES)


@pytest.mark.parametrize("arch", _no_mtp_params())
def test_no_mtp_arch_serves_the_chain_without_drafting(arch, synth_model, last_tokens, cell):
    """The model itself is sound: vanilla llama-server replies with the bigram chain."""
    with cell(arch, "serve (vanilla)", table="no-mtp"):
        spec = SynthSpec(arch=arch, mtp=False)
        with LlamaServer(ServerConfig(model=synth_model(spec), threads=THREADS, ctx_size=1024)) as srv:
            p = load_suite().limit(1).prompts[0]
            r = srv.chat(p.chat_messages(), max_tokens=MAX_TOKENS)
        assert r["choices"][0]["message"]["content"] == build_vocab().decode(
            predict_tokens(spec, last_tokens[0], MAX_TOKENS))
        assert "draft_n" not in r["timings"]


# ----------------------------------------------------------------------------- the README table stays true


def declared_test_ids() -> set[str]:
    """Every test id of this module, from the parametrize marks (each param carries its id)."""
    ids: set[str] = set()
    for name, fn in globals().items():
        if not name.startswith("test_") or not callable(fn):
            continue
        marks = [mk for mk in getattr(fn, "pytestmark", []) if mk.name == "parametrize"]
        if not marks:
            ids.add(name)
        for mk in marks:
            ids |= {f"{name}[{p.id}]" for p in mk.args[1]}
    return ids


def _table_tool() -> Any:
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import gen_arch_table

    return gen_arch_table


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_arch_matrix" name="test_inspect[a1]"><properties>
  <property name="arch" value="a1"/><property name="stage" value="inspect"/><property name="table" value="mtp"/>
</properties></testcase>
<testcase classname="tests.test_arch_matrix" name="test_verify[a1]"><properties>
  <property name="arch" value="a1"/><property name="stage" value="verify"/><property name="table" value="mtp"/>
  <property name="pinned" value="llama-server aborts | GGML_ASSERT [x] (upstream #123)"/>
</properties></testcase>
<testcase classname="tests.test_arch_matrix" name="test_inspect[a2]"><properties>
  <property name="arch" value="a2"/><property name="stage" value="inspect"/><property name="table" value="mtp"/>
</properties><failure message="boom">trace</failure></testcase>
<testcase classname="tests.test_arch_matrix" name="test_other"/>
</testsuite></testsuites>
"""


def test_the_table_tool_renders_pinned_failed_and_missing_cells(tmp_path):
    """The tool's own logic on a hand-written junit report: a pinned test reads ``xfail: reason``
    (made safe for a table cell), a failure ``FAIL``, a cell no test filled ``missing``; the README
    round trip gives the same tables back; only the block between the markers changes."""
    tool = _table_tool()
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    tables = tool.build_tables(tool.read_junit(junit))
    (t,) = tables
    assert t.columns == ("inspect", "verify") and [r.arch for r in t.rows] == ["a1", "a2"]
    assert [c.outcome for c in t.rows[0].cells] == [
        "pass", "xfail: llama-server aborts / GGML_ASSERT (x) (upstream #123)"]
    assert [c.outcome for c in t.rows[1].cells] == ["FAIL", "missing"]
    readme = f"# x\n\n{tool.BEGIN}\nold\n{tool.END}\n\n## after\n"
    new = tool.with_block(readme, tool.render(tables))
    assert new.startswith("# x\n\n") and new.endswith(f"{tool.END}\n\n## after\n")
    assert tool.readme_tables(new) == tables
    readme_path = tmp_path / "README.md"
    readme_path.write_text(new)
    assert tool.main(["--junit", str(junit), "--readme", str(readme_path), "--check"]) == 1  # FAIL cells
    readme_path.write_text(readme)
    assert tool.main(["--junit", str(junit), "--readme", str(readme_path), "--check"]) == 1  # stale


def test_the_readme_table_names_only_tests_of_this_file():
    """Every cell of README's architecture tables names a test of this module (tools/gen_arch_table.py
    writes them from a junit run of it), and every architecture with an MTP graph has a row."""
    tables = _table_tool().readme_tables((ROOT / "docs" / "concepts" / "architectures.md").read_text())
    cells = [c for t in tables for row in t.rows for c in row.cells]
    assert cells, "README has no architecture table"
    unknown = sorted({c.test_id for c in cells} - declared_test_ids())
    assert not unknown, f"README cells name tests that do not exist: {unknown}"
    assert all(c.outcome for c in cells) and not [c for c in cells if c.outcome == "FAIL"]
    rows = {row.arch for t in tables for row in t.rows}
    assert set(MTP_ARCHS) <= rows, f"no README row for {sorted(set(MTP_ARCHS) - rows)}: run tools/gen_arch_table.py"
