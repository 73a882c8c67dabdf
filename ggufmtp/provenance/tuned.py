"""The receipt's ``verification.tuned``: the server settings a card recommends, and what binds them.

Three writers fill it:

* ``tune --receipt`` and ``tune-joint --receipt`` (when the artifact's own head won) store their
  search (``kind`` :data:`TUNE_KIND` / :data:`TUNE_JOINT_KIND`): a measurement of these bytes of its
  own, so a later verification of the same bytes keeps it (:func:`is_search`);
* ``verify --sweep`` its window recommendation (no ``kind``): it describes that verification, and a
  newer one drops it;
* ``verify --tuned-from PROFILE`` the profile as served for the verified file (:func:`verified_tuned`):
  the file's own name, the head built in (never the search's cached ``--spec-draft-model`` sidecar),
  the verification's exact arguments, and the figures of this verification, not the search's.
  ``kind`` is the search that found the profile, ``profile`` names the JSON it was read from by
  name and sha256. Every other key is derived from the verification itself, so the audit derives it
  again and refuses a section that says anything else (:func:`tuned_binding_problem`); a newer
  verification drops it, as it drops a sweep's. A search's section it replaces is kept inside it
  (``search``) and comes back when it goes (:func:`carried_tuned`).

MTP is recommended only when the speedup's 95% CI lower bound is above 1.0 and the output is
lossless (tune's rule, applied to the verification's own figures); otherwise ``command`` is the
vanilla arm's and the card says plainly why (slower, undecided or not lossless, as the CI says).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from .statement import ProfileRef, TunedSection, Verification

__all__ = ["TUNE_KIND", "TUNE_JOINT_KIND", "SEARCH_KINDS", "VERIFIED_RULE", "ProfileSource", "is_search",
           "carried_tuned", "verified_tuned", "tuned_binding_problem"]

TUNE_KIND = "ggufmtp tune"
TUNE_JOINT_KIND = "ggufmtp tune-joint"
SEARCH_KINDS = (TUNE_KIND, TUNE_JOINT_KIND)

VERIFIED_RULE = ("MTP with the verified flags when this verification's speedup 95% CI lower bound is above 1.0 and "
                 "its output is lossless (verify's lossless finding passes); otherwise serve without MTP (the vanilla "
                 "arm's command)")


@dataclass(frozen=True)
class ProfileSource:
    """The file a tuned profile was read from (``verify --tuned-from``): its name only, its sha256,
    the search that wrote it (``kind``: None for a hand-written one) and whether that search
    recommended MTP (None when the file does not say)."""

    name: str
    sha256: str
    kind: str | None = None
    search_recommended: bool | None = None

    def ref(self) -> ProfileRef:
        return {"name": self.name, "sha256": self.sha256, "search_recommended": self.search_recommended}

    @classmethod
    def of_section(cls, t: TunedSection) -> ProfileSource:
        """The source a stored ``verify --tuned-from`` section names."""
        p = t.get("profile") or {}
        return cls(str(p.get("name")), str(p.get("sha256")), t.get("kind"), p.get("search_recommended"))


def is_search(t: object) -> bool:
    """Whether a stored ``tuned`` section is a search's own result (tune or tune-joint), which a
    later verification of the same bytes keeps; a sweep's or a ``--tuned-from`` verification's
    describes the verification it came with and is dropped with it."""
    return isinstance(t, Mapping) and t.get("kind") in SEARCH_KINDS and "profile" not in t


def carried_tuned(old: object, new: TunedSection | None) -> TunedSection | None:
    """The ``tuned`` section a new verification gets when it is written over one whose section was
    ``old`` (``keep_added``): a search's own section is a measurement of the same bytes, so it stays
    (a ``verify --tuned-from`` section keeps it under ``search``, and hands it back when a later
    verification drops that section); a sweep's or a ``--tuned-from`` section describes the older
    run and goes. ``new``: the new verification's own section, which wins."""
    search = old if is_search(old) else (old.get("search") if isinstance(old, Mapping) else None)
    kept = cast(TunedSection, search) if is_search(search) else None
    if not new:
        return kept
    return {**new, "search": kept} if kept and "profile" in new else new


def _command(name: str, args: Sequence[str], env: Mapping[str, str] | None) -> str:
    """The llama-server command line of the verified file: its name, then the arm's exact arguments
    (what verify served, model and address left out), after the arm's environment."""
    return shlex.join([f"{k}={v}" for k, v in sorted((env or {}).items())]
                      + ["llama-server", "--model", name, *[str(a) for a in args]])


def _served_name(v: Verification) -> str:
    """The verified file's name (``model.name`` in a receipt; the path's last part in verify's JSON)."""
    model: Mapping[str, object] = v.get("model") or {}
    name = model.get("name") or model.get("path") or "MODEL.gguf"
    return str(name).replace("\\", "/").rsplit("/", 1)[-1]


def verified_tuned(v: Verification, source: ProfileSource) -> TunedSection:
    """The ``tuned`` section of verification ``v`` (made with ``verify --tuned-from`` the file
    ``source``): the profile as served for the verified file, with ``v``'s own figures."""
    name, mtp, van = _served_name(v), v.get("mtp") or {}, v.get("vanilla") or {}
    mtp_command = _command(name, mtp.get("server_args") or [], mtp.get("server_env"))
    vanilla_command = _command(name, van.get("server_args") or [], van.get("server_env"))
    config = (v.get("settings") or {}).get("mtp_config") or {}
    key = str(config.get("key")) if config.get("key") is not None else None
    speedup, ci = v.get("speedup"), v.get("speedup_ci95")
    lo = ci[0] if ci else None
    lossless = (v.get("findings") or {}).get("lossless") == "pass"
    beats = lo is not None and lo > 1.0 and lossless
    shown = f"speedup {speedup:.3f}x, 95% CI {_ci(ci)}" if speedup is not None else "speedup not measured"
    if beats:
        why = f"{key}: {shown}, CI lower bound above 1.0, lossless (verify --tuned-from {source.name} on these bytes)"
    elif not lossless:
        why = f"{key}: its output was not lossless on these bytes ({shown}): run without MTP"
    else:
        why = f"{key}: MTP was not faster with confidence on the hardware measured ({shown}): run without MTP here"
    return {"kind": source.kind, "profile": source.ref(),
            "command": mtp_command if beats else vanilla_command, "mtp_command": mtp_command,
            "vanilla_command": vanilla_command, "recommended": key if beats else None,
            "recommended_config": dict(config) if beats else None, "best": key, "best_config": dict(config),
            "speedup": speedup, "speedup_ci95": ci, "acceptance": mtp.get("acceptance"),
            "mtp_beats_vanilla": beats, "why": why, "rule": VERIFIED_RULE}


def _ci(ci: Sequence[float | None] | None) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return "n/a"
    return f"[{ci[0]:.3f}-{ci[1]:.3f}]"


def tuned_binding_problem(v: Verification) -> str | None:
    """Why ``v``'s ``tuned`` section is not bound to ``v`` (None when it is, or when it is a search's
    or a sweep's: those are not derived from ``v``, and older receipts hold them): a ``verify
    --tuned-from`` section must say exactly what :func:`verified_tuned` derives from ``v``."""
    t = v.get("tuned")
    if not isinstance(t, Mapping) or "profile" not in t:
        return None
    want = verified_tuned(v, ProfileSource.of_section(t))
    differ = [k for k in want if k != "profile" and t.get(k) != want.get(k)]
    if not differ:
        return None
    return (f"verification.tuned (verify --tuned-from {ProfileSource.of_section(t).name}) is not this "
            f"verification's: its {', '.join(differ)} differ from what the verification measured and served "
            f"(e.g. {differ[0]} {t.get(differ[0])!r}, the verification's {want.get(differ[0])!r})")
