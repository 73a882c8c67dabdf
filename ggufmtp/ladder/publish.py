"""Publishing a ladder: ``ggufmtp ladder --upload REPO`` and ``ggufmtp upload LADDER_DIR REPO``.

Every variant gets a line before the publish gate (``Q8_0: ok``, ``IQ2_XXS: refused — <reason>``).
The whole ladder goes to the gate first, as one upload; when it passes, every variant is ``ok`` and
that is the commit. When it refuses (or with ``passing_only``), each variant goes before the gate
alone, a dry run of :func:`ggufmtp.hub.upload.upload` with its files, its receipt and the ladder's
card (exactly the real upload's checks), so each refusal is named; a variant the ladder did not make
is refused with its error. All or nothing by default: one refusal and nothing is sent (the gate
runs before any request). ``passing_only`` (``--passing-only``) publishes the variants the gate
passes, with a card of those alone (``DIR/.ggufmtp/published/README.md``; the ladder's own card is
left as it is) and the sidecars their trunks are served with, and still names the refused ones.
What goes up goes in one commit (several above ``UploadOptions.commit_max_bytes``: :mod:`ggufmtp.hub.parts`),
through the gate (the bytes sent are the bytes gated)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GgufmtpError, HubRefusedError, LadderError
from ..hub.upload import UploadOptions, UploadResult, upload
from ..jsontypes import JsonObject
from ..provenance.card_page import PageOptions
from ..provenance.ladder_card import make_ladder_card
from ..provenance.receipt import default_receipt_path

if TYPE_CHECKING:
    from .engine import VariantOutcome
    from .run import LadderResult

__all__ = ["LadderUpload", "VariantReview", "publish_ladder", "review_ladder", "upload_ladder"]

PUBLISHED_CARD = ".ggufmtp/published/README.md"  # under the ladder's folder: the card of a --passing-only upload


@dataclass(frozen=True)
class VariantReview:
    """What the publish gate said of one variant: ``problem`` None when it passes."""

    variant: str  # its release tag (its folder)
    recipe: str
    problem: str | None
    made: bool  # False: the ladder did not make it (``problem`` is its error)
    files: tuple[tuple[Path, Path], ...] = ()  # (file, receipt) that go up with it: its artifact, its sidecar

    @property
    def ok(self) -> bool:
        return self.problem is None

    def line(self) -> str:
        """``Q8_0: ok``, ``IQ2_XXS: refused — <reason>``."""
        if self.ok:
            return f"{self.variant}: ok"
        return f"{self.variant}: refused — " + (str(self.problem) if self.made else f"not made: {self.problem}")

    def to_dict(self) -> JsonObject:
        return {"variant": self.variant, "recipe": self.recipe, "ok": self.ok, "made": self.made,
                "problem": self.problem}


@dataclass(frozen=True)
class LadderUpload:
    """Every variant's review and what was sent (``upload`` None: nothing)."""

    repo_id: str
    reviews: tuple[VariantReview, ...]
    upload: UploadResult | None
    passing_only: bool = False

    @property
    def refused(self) -> list[VariantReview]:
        return [r for r in self.reviews if not r.ok]

    def refusal(self) -> GgufmtpError | None:
        """Why nothing was sent (None: it was): LadderError naming the variants the ladder did not make,
        else HubRefusedError naming each variant the gate refused and why."""
        if self.upload is not None:
            return None
        unmade = [f"{r.recipe} in {r.variant}/: {r.problem}" for r in self.refused if not r.made]
        if unmade or not self.refused:
            return LadderError(f"the ladder has variants that failed ({'; '.join(unmade) or 'all'}); "
                               "fix them and rerun the ladder before publishing it")
        return HubRefusedError(f"the publish gate refuses {len(self.refused)} of the ladder's {len(self.reviews)} "
                               f"variants, so nothing was sent to {self.repo_id}: "
                               + "; ".join(r.line() for r in self.refused))

    def sent(self) -> UploadResult:
        """The upload; :meth:`refusal` raised when nothing was sent."""
        if self.upload is None:
            raise self.refusal() or LadderError("nothing was sent")
        return self.upload

    def to_dict(self) -> JsonObject:
        return {"repo_id": self.repo_id, "passing_only": self.passing_only,
                "variants": [r.to_dict() for r in self.reviews],
                "sent": self.upload is not None, **(self.upload.to_dict() if self.upload is not None else {})}


def _files(o: VariantOutcome) -> tuple[tuple[Path, Path], ...]:
    """A made variant's (file, receipt): its artifact, and in the sidecar layout the sidecar it is served with."""
    art = ((Path(o.summary["artifact"]), Path(o.summary["receipt"])),)
    side = o.summary.get("sidecar")
    return art + (((Path(side), default_receipt_path(Path(side))),) if side else ())


def review_ladder(result: LadderResult, repo_id: str, options: UploadOptions | None = None) -> list[VariantReview]:
    """Each variant before the publish gate alone (module docstring), in recipe order."""
    opts = dataclasses.replace(options or UploadOptions(), dry_run=True)
    reviews = []
    for o in result.outcomes:
        if not o.ok:
            reviews.append(VariantReview(o.variant or "?", o.recipe, o.error or "failed", made=False))
            continue
        files, problem = _files(o), None
        try:
            upload(repo_id, [f for f, _ in files], [r for _, r in files], result.card, opts, progress=False)
        except GgufmtpError as e:  # the gate's refusal (or a file gone): this variant's reason
            problem = str(e)
        reviews.append(VariantReview(o.variant, o.recipe, problem, made=True, files=files))
    return reviews


def publish_ladder(result: LadderResult, repo_id: str, options: UploadOptions | None = None, *,
                   passing_only: bool = False, progress: bool = True) -> LadderUpload:
    """Publish the ladder in one commit, or parts of a large one (module docstring): all its variants, or with ``passing_only``
    those the gate passes; nothing when the gate refuses one (all or nothing) or all. ``options`` as
    ``ggufmtp upload``'s (branch, ``create_pr``, ``path_in_repo``, ``commit_message``: default one
    naming what goes up). All or nothing tries the whole upload first (its gate passing names every
    variant ``ok``); only a refusal sends each variant before the gate alone, to name its reason."""
    opts = options if options is not None else UploadOptions()
    if not passing_only and all(o.ok for o in result.outcomes):
        whole = [VariantReview(o.variant, o.recipe, None, made=True, files=_files(o)) for o in result.outcomes]
        try:
            return LadderUpload(repo_id, tuple(whole), _send(result, repo_id, opts, whole, False, progress))
        except HubRefusedError:  # nothing was sent (the gate runs first): which variant, and why, below
            pass
    reviews = review_ladder(result, repo_id, opts)
    passing = [r for r in reviews if r.ok]
    if not passing or (len(passing) < len(reviews) and not passing_only):
        return LadderUpload(repo_id, tuple(reviews), None, passing_only)
    sent = _send(result, repo_id, opts, passing, len(passing) < len(reviews), progress)
    return LadderUpload(repo_id, tuple(reviews), sent, passing_only)


def _send(result: LadderResult, repo_id: str, opts: UploadOptions, passing: Sequence[VariantReview],
          subset: bool, progress: bool) -> UploadResult:
    """The commit (or parts) of ``passing``'s files, their receipts and the card, through the gate."""
    arts = [r.files[0] for r in passing]
    # every sidecar the ladder made (the gate refuses one no trunk pairs with); of a subset, its trunks' own
    sidecars = (list(dict.fromkeys(f for r in passing for f in r.files[1:])) if subset
                else [(p, default_receipt_path(p)) for p in result.sidecars])
    card = _card(result, repo_id, opts, arts, [s for s, _ in sidecars], subset)
    if opts.commit_message is None:
        opts = dataclasses.replace(opts, commit_message=_commit_message(len(arts), len(sidecars)))
    files = [*arts, *sidecars]  # a sidecar passes the gate through its trunks' receipts (hub/gate.py)
    return upload(repo_id, [a for a, _ in files], [r for _, r in files], card, opts, progress=progress)


def _card(result: LadderResult, repo_id: str, opts: UploadOptions, arts: Sequence[tuple[Path, Path]],
          sidecars: list[Path], subset: bool) -> Path:
    """The card that goes up: the ladder's, rewritten when its download and run lines name another repo
    or folder; for a subset of the variants a card of those alone, beside the ladder's."""
    assert result.card is not None  # a variant passed, so the ladder wrote its card
    same_repo = (result.spec.repo_id, result.spec.path_in_repo) == (repo_id, opts.path_in_repo)
    if same_repo and not subset:
        return result.card
    card = result.spec.out_dir / PUBLISHED_CARD if subset else result.card
    card.parent.mkdir(parents=True, exist_ok=True)
    make_ladder_card(arts, card, public_key=None if opts.public_key is None else Path(opts.public_key),
                     options=PageOptions(repo_id=repo_id, quantized_by=result.spec.quantized_by,
                                         path_in_repo=opts.path_in_repo, base_model=result.spec.base_model),
                     sidecars=sidecars)
    return card


def _commit_message(variants: int, sidecars: int) -> str:
    if not sidecars:
        return f"ggufmtp ladder: {variants} MTP GGUF variants"
    return f"ggufmtp ladder: {variants} trunk-only GGUF variants and {sidecars} MTP sidecar{'s' * (sidecars > 1)}"


def upload_ladder(result: LadderResult, repo_id: str, options: UploadOptions | None = None, *,
                  progress: bool = True) -> UploadResult:
    """Every made variant, its receipt and the ladder's card in one commit (parts of a large one), through the publish gate
    (:func:`ggufmtp.ladder.publish.publish_ladder`: all or nothing); LadderError naming every variant
    that failed, HubRefusedError naming every variant the gate refuses and why; nothing is sent then."""
    return publish_ladder(result, repo_id, options, progress=progress).sent()
