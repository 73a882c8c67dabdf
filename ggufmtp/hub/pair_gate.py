"""The publish gate's rule for a split model's files (``ggufmtp sidecar``, ``ladder --layout sidecar``).

An MTP sidecar (a receipt whose ``pair`` section has the role ``sidecar``) holds no verification of
its own: what its head drafts is measured by verifying a trunk with it (``verify TRUNK --sidecar``,
recorded in the *trunk's* receipt). So :mod:`ggufmtp.hub.gate` takes a sidecar through its trunks:

* a sidecar goes up only beside at least one trunk of the same upload whose receipt names it, by
  sha256 (its ``pair`` section's ``sidecar``, or the sidecar its verification drafted with), and it
  must pair with every such trunk (:func:`~ggufmtp.provenance.pair.pair_problem` with ``bound``: the
  files fit, and the sidecar's own receipt, the one of the upload that describes its bytes, binds it
  to the trunk's source). A sidecar of another model, one whose receipt names another source, or one
  no trunk names, is refused, naming both files; so is a trunk audited with a sidecar that has no
  receipt beside it (``audit --sidecar``);
* its verification status is its trunks': verified when one of them has a publishable verification;
* a trunk whose verification drafted with a sidecar goes up only with that sidecar (by sha256), and
  is audited as that pair (``audit TRUNK --sidecar SIDECAR``): a swapped trunk or sidecar is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import GgufmtpError, HubRefusedError
from ..provenance.card_page import unverified_reason
from ..provenance.pair import pair_problem
from ..provenance.receipt import Receipt

__all__ = ["drafted_with", "is_sidecar", "sidecar_problem", "sidecar_trunks", "trunk_sidecar"]


def is_sidecar(rc: Receipt) -> bool:
    """Whether the receipt is an MTP sidecar's (its ``pair`` role)."""
    pair = rc.predicate.get("pair")
    return pair is not None and pair["role"] == "sidecar"


def drafted_with(rc: Receipt) -> str | None:
    """The sha256 of the sidecar the receipt's verification drafted with (None: its own head, or none)."""
    v = rc.predicate.get("verification") or {}
    named = (v.get("model") or {}).get("sidecar")
    return str(named["sha256"]).lower() if named else None


def _names(rc: Receipt) -> set[str]:
    """The sidecars a trunk's receipt names: its pair section's and its verification's."""
    pair = rc.predicate.get("pair")
    side = pair.get("sidecar") if pair is not None else None
    drafted = drafted_with(rc)
    return {str(d).lower() for d in (side["sha256"] if side else None, drafted) if d}


def _pairs(trunk: Path, sidecar: Path, receipts: Mapping[Path, Receipt]) -> str | None:
    """Why the upload's ``sidecar`` does not pair with its ``trunk``, by their receipts in the upload
    (a sidecar without one describing its bytes, or naming another source, is refused)."""
    try:
        return pair_problem(trunk, sidecar, bound=True, trunk_receipt=receipts.get(trunk),
                            sidecar_receipt=receipts.get(sidecar))
    except GgufmtpError as e:
        return str(e)


def sidecar_trunks(sidecar: Path, sha256: str, artifacts: Mapping[Path, str],
                   receipts: Mapping[Path, Receipt]) -> list[Path]:
    """The trunks of the upload whose receipts name ``sidecar`` (module docstring); HubRefusedError
    when there is none, or one it does not pair with."""
    trunks = [t for t in artifacts if t != sidecar and not is_sidecar(receipts[t])
              and sha256.lower() in _names(receipts[t])]
    if not trunks:
        others = [t for t in artifacts if t != sidecar and not is_sidecar(receipts[t])]
        why = "; ".join(p for t in others if (p := _pairs(t, sidecar, receipts))) if others else ""
        raise HubRefusedError(f"refusing to publish the MTP sidecar {sidecar} (sha256 {sha256}): no trunk in this "
                              f"upload names it in its receipt (a sidecar goes up with the trunks verified with it)"
                              + (f": {why}" if why else ""))
    for t in trunks:
        if problem := _pairs(t, sidecar, receipts):
            raise HubRefusedError(f"refusing to publish {sidecar} with {t}: {problem}")
    return trunks


def sidecar_problem(sidecar: Path, sha256: str, artifacts: Mapping[Path, str],
                    receipts: Mapping[Path, Receipt]) -> str | None:
    """Why the sidecar is not verified (None: a trunk of the upload that names it is); raises as
    :func:`sidecar_trunks` when it goes up with no trunk of its own."""
    trunks = sidecar_trunks(sidecar, sha256, artifacts, receipts)
    why = {t: unverified_reason(receipts[t].statement, artifacts[t]) for t in trunks}
    if any(w is None for w in why.values()):
        return None
    return "served only with trunks that are not verified (" + "; ".join(f"{t.name}: {w}" for t, w in why.items()) + ")"


def trunk_sidecar(trunk: Path, rc: Receipt, artifacts: Mapping[Path, str]) -> Path | None:
    """The sidecar of the upload that ``trunk``'s verification drafted with (None when it drafted
    with its own head); HubRefusedError when that sidecar is not in the upload."""
    drafted = drafted_with(rc)
    if drafted is None or is_sidecar(rc):
        return None
    found = next((p for p, sha in artifacts.items() if sha.lower() == drafted), None)
    if found is None:
        v = rc.predicate.get("verification") or {}
        named = (v.get("model") or {}).get("sidecar")
        name = named["name"] if named else "?"
        raise HubRefusedError(f"refusing to publish {trunk}: its verification drafted with the MTP sidecar {name} "
                              f"(sha256 {drafted}), which is not in this upload: publish the trunk with that sidecar")
    return found
