"""One check and its outcome: what the audit (:mod:`ggufmtp.provenance.audit`) and quantize's
post-write checks (:func:`ggufmtp.quant.quantize.audit_against_plan`) report, one type for both."""

from __future__ import annotations

import dataclasses
import enum

from .jsontypes import JsonObject

__all__ = ["Check", "Status"]


class Status(str, enum.Enum):
    """A check's outcome: it verified something, it failed, or it only reports (nothing checked)."""

    PASS = "pass"
    FAIL = "fail"
    INFO = "info"


@dataclasses.dataclass
class Check:
    """One check. ``ok`` (PASS or INFO) is False only for a failure; INFO checked nothing."""

    name: str
    ok: bool
    detail: str = ""
    status: Status | None = None

    def __post_init__(self) -> None:
        if self.status is None:
            self.status = Status.PASS if self.ok else Status.FAIL
        self.ok = self.status != Status.FAIL

    @classmethod
    def info(cls, name: str, detail: str) -> Check:
        return cls(name, True, detail, Status.INFO)

    def to_dict(self) -> JsonObject:
        assert self.status is not None
        return {"name": self.name, "ok": self.ok, "status": self.status.value, "detail": self.detail}
