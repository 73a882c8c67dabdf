"""A verification's verdict: the thresholds (:class:`Thresholds`), the verdict (:class:`Verdict`) and
the policy that turns each thinking mode's numbers into a verdict (:func:`evaluate_verdict`). It
lives with the receipts because it is what a receipt claims: ``verify`` judges with it, and
``audit``, the publish gate and the card re-judge the recorded figures with the same policy.

Policy (see :mod:`ggufmtp.measure.verify.run`): there is always a threshold set (a recipe's ``[verify]``,
else :data:`DEFAULT_THRESHOLDS`); "none" is not a verdict, and a recorded verdict without thresholds
fails :func:`judge_recorded`. Acceptance >= ``min_acceptance``; outputs identical to vanilla in at least
``min_identical`` of the pairs of EVERY comparison
verify made (each mode's chat arm, ``--raw``, every sweep window; default 1.0: any differing reply
fails, and the reason names the comparison and the first differing prompt); speedup >=
``min_speedup`` only when the model was offloaded to a GPU (or ``enforce_speedup``), since a small
model on CPU is compute-bound and MTP is expected to be slower there. With several slots measured
(``verify --parallel N``, :mod:`ggufmtp.measure.verify.slots`), each slot count's acceptance must lie within
the single-slot acceptance's 95% CI and each request's MTP reply must equal vanilla's reply to the same
request at the same slot count; a reply carrying another request's text fails whatever ``min_identical``
allows (:func:`slot_failures`, :mod:`ggufmtp.provenance.slot_identity`).

Numerics: a differing reply counts against ``min_identical`` only when it is *explained by
numerics* (:func:`numerics_failure` finds nothing wrong with it):

- vanilla's top-2 margin at the divergence (``margin_nats``) is at most the run's
  ``numerics_drift_nats``, the largest margin change that evaluating a prefix as one batch instead
  of token by token caused on the same run (:mod:`ggufmtp.measure.verify.divergence`);
- that drift was measured on at least :data:`MIN_DRIFT_POSITIONS` positions and is at most
  :data:`MAX_DRIFT_NATS` (a batching that moves margins by more is not a rounding to forgive);
- the MTP reply's token there is vanilla's runner-up or vanilla's own one-batch argmax, BY TOKEN ID
  as the servers generated and listed them (``mtp_token_id`` equals ``runner_up_token_id`` or
  ``batched_token_id`` and differs from ``vanilla_token_id``; one id, one recorded text): a token
  vanilla ranks third is a real divergence, however small the margin, and so is one whose text
  merely begins with the runner-up's;
- numerics explain at most :data:`MAX_EXPLAINED_SHARE` of a comparison's pairs; mismatches are
  counted once per (prompt, seed, mode, endpoint, k), and only those the run measured: a listed
  mismatch under a seed, prompt, mode, endpoint or window the settings do not record is refused as
  not what verify writes (:func:`unmeasured_mismatches`).

The rule is recomputed from the recorded figures, never read from a recorded ``explained`` flag; a
mismatch without them (an older receipt's text-only record, an unreproducible or unanalysed reply)
is unexplained.
These bounds are policy, not thresholds: a receipt cannot loosen them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..fmt import pct, times
from ..jsontypes import JsonObject
from .evidence import Evidence, int_or_zero
from .head import HeadComparison, HeadDecision, HeadFinding
from .numerics import (
    EXCERPT_BEFORE,
    MAX_DRIFT_NATS,
    MAX_EXPLAINED_SHARE,
    MIN_DRIFT_POSITIONS,
    Divergence,
    RecordedMismatch,
    explained_by_numerics,
    nats,
    numerics_failure,
    unmeasured_mismatches,
)
from .placement import Placement
from .slot_identity import identity_failures

__all__ = ["DEFAULT_THRESHOLDS", "Divergence", "EXCERPT_BEFORE", "Evidence", "Finding", "Findings", "HeadBasis",
           "Judgment", "MAX_DRIFT_NATS", "MAX_EXPLAINED_SHARE", "MIN_DRIFT_POSITIONS", "OVERALL_RULE",
           "Thresholds", "Verdict", "evaluate_verdict", "explained_by_numerics", "judge", "judge_record",
           "judge_recorded", "numerics_failure", "slot_failures", "speed_checked", "unmeasured_mismatches"]


class Verdict(enum.StrEnum):
    """The outcome of a verification; its value is the JSON string ("pass" / "fail")."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # nothing failed, and the head finding is undecided: more evidence decides


# The project's thresholds, for a verification that names no recipe: the loosest of the shipped
# recipes' ``[verify]`` tables (iq4_xs-mtp: acceptance 45 %, speedup 1.05x) rounded to round figures.
DEFAULT_SOURCE = "ggufmtp defaults"
DEFAULT_MIN_ACCEPTANCE = 0.50
DEFAULT_MIN_SPEEDUP = 1.10


@dataclass(frozen=True)
class Thresholds:
    """What a verification must reach. ``source`` says where the figures came from ("ggufmtp
    defaults", "recipe NAME", "recipe NAME + flags", ...). Built with no arguments it is the
    project's defaults: there is always a threshold."""

    min_acceptance: float | None = DEFAULT_MIN_ACCEPTANCE
    min_speedup: float | None = DEFAULT_MIN_SPEEDUP
    min_identical: float = 1.0
    enforce_speedup: bool = False
    source: str = DEFAULT_SOURCE
    # with a reference measured, the head is judged against it and ``min_acceptance`` only when this
    # is on (``--absolute-acceptance``); without a reference, ``min_acceptance`` judges it as before
    absolute_acceptance: bool = False
    head_margin: float | None = None  # the recipe's [verify] head_margin (None: ggufmtp's, provenance.head)

    @classmethod
    def from_recipe(cls, table: Any, name: str | None = None) -> Thresholds:
        """The thresholds of a recipe's ``[verify]`` table (``ggufmtp.quant.recipe.VerifyThresholds``);
        a figure the table leaves out is the project's default (and ``source`` says so)."""
        acc, sp = getattr(table, "min_acceptance", None), getattr(table, "min_speedup", None)
        source = f"recipe {name}" if name else "recipe"
        if acc is None or sp is None:
            source += f" + {DEFAULT_SOURCE}"
        return cls(min_acceptance=DEFAULT_MIN_ACCEPTANCE if acc is None else acc,
                   min_speedup=DEFAULT_MIN_SPEEDUP if sp is None else sp, source=source,
                   head_margin=getattr(table, "head_margin", None))

    def merged(self, min_acceptance: float | None = None, min_speedup: float | None = None,
               min_identical: float | None = None, enforce_speedup: bool = False) -> Thresholds:
        """These thresholds with explicit settings (command-line flags) over them: a given
        acceptance or speedup replaces this one and adds "flags" to ``source``; ``min_identical``
        replaces when given; ``enforce_speedup`` can only switch the check on."""
        th = self
        if min_acceptance is not None or min_speedup is not None:
            th = dataclasses.replace(
                th, min_acceptance=th.min_acceptance if min_acceptance is None else min_acceptance,
                min_speedup=th.min_speedup if min_speedup is None else min_speedup,
                source="flags" if None not in (min_acceptance, min_speedup) else f"{th.source} + flags")
        return dataclasses.replace(th, enforce_speedup=enforce_speedup or th.enforce_speedup,
                                   min_identical=th.min_identical if min_identical is None else float(min_identical))

    @classmethod
    def coerce(cls, t: Any) -> Thresholds:
        """``t`` as thresholds: a Thresholds, its dict, a recipe's ``VerifyThresholds``, or None (the
        project's defaults)."""
        if t is None:
            return cls()
        if isinstance(t, Thresholds):
            return t
        if isinstance(t, dict):
            return cls(**{k: v for k, v in t.items() if k in {f.name for f in dataclasses.fields(cls)}})
        return cls.from_recipe(t)

    def to_dict(self) -> JsonObject:
        return dataclasses.asdict(self)


DEFAULT_THRESHOLDS = Thresholds()


class Figures(Protocol):
    """What the policy reads of a comparison: a live one (``measure.verify.summary.Comparison``) or a
    recorded one (:class:`RecordedFigures`)."""

    acceptance: float | None
    speedup: float | None
    identical_output_fraction: float | None
    identical: int
    n_pairs: int
    mismatches: Sequence[Any]


@dataclass(frozen=True)
class RecordedFigures:
    """A comparison's figures as a receipt records them (see :func:`judge_recorded`)."""

    acceptance: float | None
    speedup: float | None
    identical_output_fraction: float | None
    identical: int = 0
    n_pairs: int = 0
    mismatches: Sequence[Any] = ()

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> RecordedFigures:
        mtp = d.get("mtp") if isinstance(d.get("mtp"), Mapping) else {}
        io = d.get("identical_outputs") if isinstance(d.get("identical_outputs"), Mapping) else {}
        return cls(_number(mtp.get("acceptance")), _number(d.get("speedup")),
                   _number(d.get("identical_output_fraction")), int_or_zero(io.get("identical")), int_or_zero(io.get("pairs")))


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def speed_checked(thresholds: Thresholds, offloaded: bool | Placement) -> bool:
    """Whether the speedup threshold is judged: with the weights on the GPU, or when enforced."""
    resident = offloaded.gpu_resident if isinstance(offloaded, Placement) else offloaded
    return bool(resident or thresholds.enforce_speedup)


def speed_judged_record(v: Mapping[str, Any], malformed: bool = True) -> bool:
    """Whether a recorded verification's verdict judged its speedup; ``malformed``: the answer for a
    threshold table that does not parse (a check takes it as judged, a claim as not)."""
    th = v.get("thresholds")
    try:
        return speed_checked(Thresholds.coerce(dict(th if isinstance(th, Mapping) else {})), Placement.of_record(v))
    except (TypeError, ValueError):
        return malformed


def judge_recorded(v: Mapping[str, Any]) -> tuple[Verdict, list[str]]:
    """``(verdict, reasons)`` of :func:`judge_record`."""
    j = judge_record(v)
    return j.verdict, j.reasons


def judge_record(v: Mapping[str, Any]) -> Judgment:
    """The judgment the policy gives the figures a receipt's ``verification`` records (each mode's
    acceptance, speedup and identical output, the identical output over every comparison, the
    listed mismatches with their margins and the run's numerics drift, the head's pairs with the
    reference, the thresholds and whether the model was offloaded). A record without thresholds
    fails: "none" is not a verdict. So does a record whose figures are not what verify writes: a
    mode that is not an object, a headline that is not the judged (first) mode's, a point estimate
    outside its own CI, a head section that does not parse or whose totals are not the mode's."""
    th_d = v.get("thresholds")
    if not isinstance(th_d, Mapping) or not isinstance(th_d.get("min_acceptance"), (int, float)):
        return Judgment(["the verification records no acceptance threshold: a verdict without thresholds "
                         "is not a verdict"], [], [], [], HeadBasis.NONE, False)
    th = Thresholds.coerce(dict(th_d))
    listed = [RecordedMismatch.of(x) for x in v.get("mismatches") or [] if isinstance(v.get("mismatches"), list)]
    unmeasured = unmeasured_mismatches(listed, v.get("settings"))
    listed = [m for m in listed if m not in unmeasured]  # refused below: none may count as explained
    overall = dataclasses.replace(RecordedFigures.of(v), mismatches=listed)
    modes = v.get("modes") if isinstance(v.get("modes"), Mapping) and v.get("modes") else None
    per_mode = {str(m): _recorded_mode(str(m), d, v, listed) for m, d in modes.items()} if modes else {"default": overall}
    head, head_problems = _recorded_head(v, modes)
    drift = _number(v.get("numerics_drift_nats"))
    j = judge(per_mode, th, Placement.of_record(v), [overall], drift, int_or_zero(v.get("numerics_positions")), head)
    j.head.extend(head_problems)
    j.lossless.extend(_shape_failures(v, modes) + _section_failures(v, modes) + slot_failures(v.get("slots"), th))
    j.lossless.extend(f"the mismatch listed under prompt {m.prompt_id!r} seed {m.seed} ({m.mode}, {m.endpoint}, k={m.k}) "
                      f"is not one the run measured ({why}): not what verify writes" for m, why in unmeasured.items())
    return j


def _section_failures(v: Mapping[str, Any], modes: Mapping[str, Any] | None) -> list[str]:
    """What the added sections claim beyond the main comparison, re-judged: the slot study's
    single-slot reference must be the judged (first) mode's acceptance and CI; a matrix cell that
    says "pass" must rest on the evidence minimum."""
    out = []
    slots, first = v.get("slots"), next(iter(modes.values()), None) if modes else v
    ref = slots.get("reference") if isinstance(slots, Mapping) else None
    if isinstance(ref, Mapping) and isinstance(first, Mapping):
        mine = (_number(_path(first, "mtp", "acceptance")), _path(first, "mtp", "acceptance_ci95"))
        theirs = (_number(ref.get("acceptance")), ref.get("acceptance_ci95"))
        if mine != theirs:
            out.append(f"the slot study's single-slot reference {theirs[0]!r} {theirs[1]!r} is not the judged comparison's "
                       f"acceptance {mine[0]!r} {mine[1]!r}")
    mx = v.get("matrix")
    if mx is not None and (not isinstance(mx, Mapping) or not isinstance(mx.get("cells"), list) or not mx["cells"]):
        out.append("the matrix section measured no cell: a section with nothing measured is no evidence")
    if isinstance(mx, Mapping) and any(isinstance(c, Mapping) and c.get("verdict") == "pass" for c in mx.get("cells") or []):
        st = mx.get("settings") if isinstance(mx.get("settings"), Mapping) else {}
        ev = Evidence.of_settings({**st, "n_prompts": _path(mx, "suite", "n_prompts")})
        if ev.shortfall:
            out.append(f"the matrix's passing cells rest on too little evidence ({ev.shortfall})")
    return out


def _shape_failures(v: Mapping[str, Any], modes: Mapping[str, Any] | None) -> list[str]:
    """What makes recorded figures unjudgeable: a mode that is not an object, a headline that is
    not the first mode's figures, a point estimate outside its own CI."""
    out = [f"the verification's mode {m!r} is not an object" for m, d in (modes or {}).items()
           if not isinstance(d, Mapping)]
    if out or not modes:
        return out
    first = next(iter(modes.values()))
    for name, get in (("acceptance", lambda d: _path(d, "mtp", "acceptance")), ("speedup", lambda d: d.get("speedup"))):
        if get(v) != get(first):
            out.append(f"the headline {name} {get(v)!r} is not the judged mode's {get(first)!r}")
    for where, d in (("headline", v), *((f"mode {m!r}", d) for m, d in modes.items())):
        for name, x, ci in (("acceptance", _path(d, "mtp", "acceptance"), _path(d, "mtp", "acceptance_ci95")),
                            ("speedup", d.get("speedup"), d.get("speedup_ci95"))):
            lo, hi = (ci + [None, None])[:2] if isinstance(ci, list) else (None, None)
            x, lo, hi = _number(x), _number(lo), _number(hi)
            if x is not None and lo is not None and hi is not None and not lo - 1e-9 <= x <= hi + 1e-9:
                out.append(f"{where}: {name} {x:.4g} lies outside its own 95% CI [{lo:.4g}, {hi:.4g}]")
    return out


def _path(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, Mapping) else None
    return d


def _recorded_head(v: Mapping[str, Any], modes: Mapping[str, Any] | None
                   ) -> tuple[dict[str, HeadFinding] | None, list[str]]:
    """The head's findings re-derived from the recorded pairs (None: no reference was measured),
    and why the section cannot be trusted: it does not parse, or its artifact totals are not the
    judged mode's ``draft_n``/``draft_n_accepted``."""
    if v.get("head") is None:
        return None, []
    try:
        hc = HeadComparison.of_dict(v.get("head"))
    except ValueError as e:
        return {}, [f"the head section is not what verify writes: {e}"]
    st = v.get("settings") if isinstance(v.get("settings"), Mapping) else {}
    run_modes = st.get("modes") if isinstance(st.get("modes"), list) else list(modes or ["default"])
    problems = hc.run_problems(st, run_modes)
    for mode in hc.modes:
        d = (modes or {}).get(mode, v if mode == "default" else None)
        pairs = [p for p in hc.pairs if p.mode == mode]
        drafted, accepted = sum(p.drafted for p in pairs), sum(p.accepted for p in pairs)
        if (_path(d, "mtp", "draft_n"), _path(d, "mtp", "draft_n_accepted")) != (drafted, accepted):
            problems.append(f"head [{mode}]: the pairs' totals ({accepted}/{drafted}) are not the mode's recorded "
                            "draft counts")
    return hc.findings(), problems


def _recorded_mode(mode: str, d: Mapping[str, Any], v: Mapping[str, Any],
                   listed: Sequence[RecordedMismatch]) -> RecordedFigures:
    """A mode's recorded figures: its chat comparison at the shipped window (pairs = prompts x
    seeds of the settings) and the listed mismatches that belong to it."""
    if not isinstance(d, Mapping):
        return RecordedFigures(None, None, None)
    f = RecordedFigures.of(d)
    ev = Evidence.of_settings(v.get("settings") if isinstance(v.get("settings"), Mapping) else None)
    st = v.get("settings") if isinstance(v.get("settings"), Mapping) else {}
    pairs = ev.prompts * ev.seeds
    if not pairs or f.identical_output_fraction is None:
        return f
    k = st.get("draft_n_max")
    own = [m for m in listed if m.mode == mode and m.endpoint in ("chat", None) and (k is None or m.k == k)]
    return dataclasses.replace(f, identical=round(f.identical_output_fraction * pairs), n_pairs=pairs, mismatches=own)


def slot_failures(slots: Any, t: Thresholds) -> list[str]:
    """Why the acceptance under several slots fails (none when it holds, or nothing was measured).
    ``slots``: the verification's ``slots`` section (:meth:`ggufmtp.measure.verify.slots.SlotStudy.to_dict`):
    the single-slot ``reference`` (acceptance and its CI) and one row per slot count, each with its
    per-request records (:mod:`ggufmtp.provenance.slot_identity`)."""
    if slots is None:
        return []
    if not isinstance(slots, Mapping) or not isinstance(slots.get("reference"), Mapping) \
            or not isinstance(slots.get("rows"), list):
        return ["the slots section is not what verify --parallel writes"]
    if not slots["rows"]:
        return ["the slots section measured no slot count: a section with nothing measured is no evidence"]
    ref = slots["reference"]
    point = _number(ref.get("acceptance"))
    ci = ref.get("acceptance_ci95") if isinstance(ref.get("acceptance_ci95"), list) else []
    lo, hi = (_number(ci[0]), _number(ci[1])) if len(ci) == 2 else (None, None)
    lo, hi = (point, point) if lo is None or hi is None else (lo, hi)  # no CI (one prompt): the point itself
    out = []
    for row in slots["rows"]:
        row = row if isinstance(row, Mapping) else {}
        n, acc = row.get("slots"), _number(row.get("acceptance"))
        if acc is None or lo is None or hi is None or not lo <= acc <= hi:
            out.append(f"acceptance at {n} slots {pct(acc)} lies outside the single-slot acceptance's 95% CI "
                       f"[{pct(lo)}, {pct(hi)}] (upstream ggml-org/llama.cpp#27572: the MTP head under -np > 1)")
        out.extend(identity_failures(row, t.min_identical))  # per request, not a count (llama.cpp#28286)
    return out


class Finding(enum.StrEnum):
    """One of a verdict's three findings; its value is the JSON string."""

    PASS = "pass"
    FAIL = "fail"
    NOT_VERIFIED = "not verified"
    INCONCLUSIVE = "inconclusive"


class HeadBasis(enum.StrEnum):
    """What the head was judged by: the paired comparison with a reference, an absolute minimum, both."""

    REFERENCE = "reference"
    MINIMUM = "minimum"
    BOTH = "reference and minimum"
    NONE = "none"


# The overall rule, written once (docs/concepts/verification.md says it in words).
OVERALL_RULE = ("pass when all three findings hold: the head is preserved (its acceptance non-inferior to the "
                "reference's, or at least the absolute minimum where no reference was measured), the output is "
                "lossless (identical to vanilla up to sound numerics), and the speed meets its minimum where it is "
                "verified (GPU offload; 'not verified' otherwise, which does not fail the verdict)")


@dataclass(frozen=True)
class Findings:
    """A verdict's three named findings: the head (preserved against the reference, or meeting the
    absolute minimum), lossless output, and speed ("not verified" without GPU offload)."""

    head: Finding
    head_basis: HeadBasis
    lossless: Finding
    speed: Finding

    def text(self) -> str:
        """``head preserved (vs reference); lossless; speed not verified``."""
        ok = self.head == Finding.PASS
        head = {HeadBasis.REFERENCE: "head preserved" if ok else "head degraded",
                HeadBasis.MINIMUM: "head meets the minimum" if ok else "head below the minimum",
                HeadBasis.BOTH: "head preserved and meets the minimum" if ok else "head degraded or below the minimum",
                HeadBasis.NONE: "head not judged"}[self.head_basis]
        if self.head == Finding.INCONCLUSIVE:
            head = "head inconclusive"
        basis = " (vs reference)" if self.head_basis in (HeadBasis.REFERENCE, HeadBasis.BOTH) else ""
        lossless = "lossless" if self.lossless == Finding.PASS else "NOT lossless"
        speed = {Finding.PASS: "speed verified", Finding.FAIL: "speed below minimum",
                 Finding.NOT_VERIFIED: "speed not verified"}[self.speed]
        return f"{head}{basis}; {lossless}; {speed}"

    def to_dict(self) -> JsonObject:
        return {"head": self.head.value, "head_basis": self.head_basis.value, "lossless": self.lossless.value,
                "speed": self.speed.value}

    @classmethod
    def of_dict(cls, d: Any) -> Findings | None:
        """The findings :meth:`to_dict` wrote (None: anything else)."""
        try:
            return cls(Finding(d["head"]), HeadBasis(d["head_basis"]), Finding(d["lossless"]), Finding(d["speed"]))
        except (TypeError, KeyError, ValueError):
            return None


@dataclass(frozen=True)
class Judgment:
    """The policy's answer: the failures by finding, the notes, and what they make."""

    head: list[str]
    lossless: list[str]
    speed: list[str]
    notes: list[str]
    head_basis: HeadBasis
    speed_applies: bool
    undecided: list[str] = dataclasses.field(default_factory=list)  # why the head is inconclusive

    @property
    def failures(self) -> list[str]:
        return self.head + self.lossless + self.speed

    @property
    def reasons(self) -> list[str]:
        """The failures, then what left the head undecided."""
        return self.failures + self.undecided

    @property
    def verdict(self) -> Verdict:
        """FAIL on any failure; else INCONCLUSIVE while the head is undecided; else PASS."""
        return Verdict.FAIL if self.failures else Verdict.INCONCLUSIVE if self.undecided else Verdict.PASS

    @property
    def findings(self) -> Findings:
        def f(failures: list[str], judged: bool = True) -> Finding:
            return Finding.FAIL if failures else Finding.PASS if judged else Finding.NOT_VERIFIED
        head = Finding.INCONCLUSIVE if self.undecided and not self.head else \
            f(self.head, self.head_basis != HeadBasis.NONE)
        return Findings(head, self.head_basis, f(self.lossless), f(self.speed, self.speed_applies))


def evaluate_verdict(per_mode: Mapping[str, Figures], thresholds: Thresholds, offloaded: bool | Placement,
                     others: Sequence[Figures] = (), drift_nats: float | None = None,
                     drift_positions: int = 0) -> tuple[Verdict, list[str], list[str]]:
    """``(verdict, reasons, notes)`` of :func:`judge` (without a reference)."""
    j = judge(per_mode, thresholds, offloaded, others, drift_nats, drift_positions)
    return j.verdict, j.reasons, j.notes


def judge(per_mode: Mapping[str, Figures], thresholds: Thresholds, offloaded: bool | Placement,
          others: Sequence[Figures] = (), drift_nats: float | None = None, drift_positions: int = 0,
          head: Mapping[str, Any] | None = None) -> Judgment:
    """The :class:`Judgment` of each mode's main numbers and every other comparison's identity.

    ``per_mode[mode]`` is the :class:`~ggufmtp.measure.verify.summary.Comparison` of the chat arm at
    k = draft_n_max (its ``acceptance``, ``speedup`` and identical output are judged);
    ``others``: every other comparison of the run (``--raw``, other sweep windows), whose replies
    must equal vanilla's too. ``drift_nats``: the run's numerics drift (measured on
    ``drift_positions`` positions); a differing reply whose ``margin_nats`` is at most it is explained
    by numerics and does not count against ``min_identical``. ``head``: each mode's
    :class:`~ggufmtp.provenance.head.HeadFinding` against the reference, when one was measured (then
    ``min_acceptance`` applies only with ``absolute_acceptance``). The failures (verdict FAIL iff
    any) are kept by finding; ``notes`` explain what was not checked and why.
    """
    t = thresholds
    speed_applies = speed_checked(t, offloaded)
    heads: list[str] = []
    lossless: list[str] = []
    speed: list[str] = []
    notes: list[str] = []
    undecided: list[str] = []
    drift = (drift_nats, drift_positions)
    minimum = t.min_acceptance is not None and (not head or t.absolute_acceptance)
    basis = (HeadBasis.BOTH if head and minimum else HeadBasis.REFERENCE if head
             else HeadBasis.MINIMUM if minimum else HeadBasis.NONE)
    if basis == HeadBasis.NONE:
        heads.append("no acceptance threshold set: a verdict without thresholds is not a verdict (and no reference "
                     "was measured: the head is not judged)")
    elif head and t.min_acceptance is not None and not minimum:
        notes.append(f"the head is judged against the reference; the absolute minimum {pct(t.min_acceptance)} "
                     f"({t.source}) is not applied (--absolute-acceptance applies it too)")
    for mode, m in per_mode.items():
        tag = "" if len(per_mode) == 1 else f" [{mode}]"
        if minimum and (m.acceptance is None or m.acceptance < t.min_acceptance):  # type: ignore[operator]
            heads.append(f"acceptance{tag} {pct(m.acceptance)} is below the minimum {pct(t.min_acceptance)}")
        if head:
            hf = head.get(mode)
            if hf is None:
                heads.append(f"head{tag}: no pairs with the reference in this mode")
            elif hf.decision == HeadDecision.DEGRADED:
                heads.append(str(hf.reason(tag)))
            elif hf.decision == HeadDecision.INCONCLUSIVE:
                undecided.append(str(hf.reason(tag)))
        lossless += _identity_failure(tag, m, t, drift, notes)
        sp = m.speedup
        if t.min_speedup is not None and speed_applies and (sp is None or sp < t.min_speedup):
            speed.append(f"speedup{tag} {times(sp)} is below the minimum {times(t.min_speedup)}")
    for c in others:
        if not any(c is m for m in per_mode.values()):
            lossless += _identity_failure(f" [{_where(c)}]", c, t, drift, notes)
    notes += _unchecked_notes(t, speed_applies, offloaded if isinstance(offloaded, Placement) else Placement(offloaded))
    if t.min_identical < 1.0:
        notes.append(f"identical output required in only {pct(t.min_identical)} of the pairs (--min-identical): "
                     "replies that differ from vanilla without a numerics explanation are tolerated up to that share")
    return Judgment(heads, lossless, speed, notes, basis, speed_applies and t.min_speedup is not None, undecided)


def _where(c: Any) -> str:
    """A comparison's name in a reason: ``k=2, raw /completion, thinking`` (recorded figures, which
    cover every comparison: ``all comparisons``)."""
    if isinstance(c, RecordedFigures):
        return "all comparisons"
    return ", ".join([f"k={c.k}"] + (["raw /completion"] if c.endpoint == "raw" else [])
                     + ([c.mode] if c.mode != "default" else []))


def _mismatch_key(x: Any) -> tuple[Any, ...]:
    return (x.prompt_id, x.seed, x.mode, x.endpoint, x.k)


def _identity_failure(tag: str, m: Figures, t: Thresholds, drift: tuple[float | None, int],
                      notes: list[str]) -> list[str]:
    """The reason a comparison fails the identity requirement (none when it meets it); a note when
    differences were forgiven as numerics. Only unexplained differences count against ``min_identical``."""
    ident = m.identical_output_fraction
    n_mis = m.n_pairs - m.identical if m.n_pairs else 0
    listed = list({_mismatch_key(x): x for x in m.mismatches}.values())  # one reply listed twice counts once
    why = [x for x in listed if explained_by_numerics(x, drift[0], drift[1])][:n_mis]
    unexplained = n_mis - len(why)
    if len(why) > MAX_EXPLAINED_SHARE * m.n_pairs:
        return [f"identical output{tag}: numerics would explain {len(why)} of {m.n_pairs} replies, more than the "
                f"{pct(MAX_EXPLAINED_SHARE)} a rounding can account for: the differences are the model's, not numerics"]
    ok_frac = ident + len(why) / m.n_pairs if ident is not None and m.n_pairs else ident
    if ok_frac is not None and ok_frac >= t.min_identical:
        if why:
            notes.append(f"identical output{tag}: {m.identical}/{m.n_pairs} ({pct(ident)}); "
                         + (f"the {len(why)} differences are" if len(why) > 1 else "the difference is")
                         + f" numerics (vanilla's margin at each <= {nats(drift[0])}, the drift batching alone "
                         f"causes on this model, measured on {drift[1]} positions)"
                         + (f"; {unexplained} unexplained, within --min-identical" if unexplained else ""))
        return []
    first = next((x for x in listed if x not in why), None)
    where = (f"; first: prompt {first.prompt_id!r} seed {first.seed} differs at character "
             f"{first.first_difference_at}, unexplained ({numerics_failure(first, drift[0], drift[1])}; vanilla's margin "
             f"there {nats(getattr(first, 'margin_nats', None))}, numerics drift {nats(drift[0])})" if first else "")
    forgiven = f", {len(why)} more explained by numerics" if why else ""
    return [f"identical output{tag}: {m.identical}/{m.n_pairs} MTP replies ({pct(ident)}) equal the vanilla replies"
            f"{forgiven}; {unexplained} unexplained difference(s) (required {pct(t.min_identical)} without one); "
            f"speculative decoding at temperature 0 must be lossless{where}"]


def _unchecked_notes(t: Thresholds, speed_applies: bool, placement: Placement) -> list[str]:
    notes = []
    if t.min_speedup is None:
        notes.append("no speedup threshold set: speed not verified")
    elif not speed_applies:
        notes.append(f"speed not verified on this hardware: the speedup threshold {times(t.min_speedup)} was not "
                     f"applied because {placement.why_unjudged()}; the speedup is reported for information "
                     "(--enforce-speedup checks it anyway)")
    elif not placement.gpu_resident:
        notes.append("speedup threshold enforced " + ("on a CPU run" if not placement.offloaded
                                                      else "with weights in host memory") + " (--enforce-speedup)")
    return notes
