"""Audit re-judges what the added sections of a verification claim (issue #40, item 5): the slot
study's single-slot reference must be the judged comparison, and a matrix cell that says "pass"
must rest on the evidence minimum; both passed audit unjudged before. Real audits of a real
artifact with designed receipts (tests/receipt_kit.py)."""

from __future__ import annotations

import copy
import json

from receipt_kit import honest_statement, slot_replies, synth_artifact

from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import seal
from ggufmtp.provenance.verdict import judge_recorded


def _audited(tmp_path, mutate) -> tuple[bool, list[str]]:
    art = synth_artifact(tmp_path)
    st = honest_statement(art, acceptance=0.9)
    mutate(st["predicate"]["verification"])
    rc = tmp_path / f"{art.name}.receipt.json"
    rc.write_text(json.dumps(seal(st)))
    rep = audit(art, rc, progress=False)
    return rep.ok, [c.detail for c in rep.checks if not c.ok]


def _slots(v: dict, acceptance: float, ci: list) -> None:
    v["slots"] = {"reference": {"slots": 1, "acceptance": acceptance, "acceptance_ci95": ci},
                  "rows": [{"slots": 2, "acceptance": acceptance, "acceptance_ci95": ci, "identical": 162, "pairs": 162,
                            "replies": slot_replies(162)}]}


def test_the_slot_reference_must_be_the_judged_comparison(tmp_path):
    ok, _ = _audited(tmp_path / "a", lambda v: _slots(v, v["mtp"]["acceptance"], list(v["mtp"]["acceptance_ci95"])))
    assert ok
    # a slot study measured against another reference (0.5 +- 0.4: any row lies inside) no longer passes
    ok, failed = _audited(tmp_path / "b", lambda v: _slots(v, 0.5, [0.1, 0.9]))
    assert not ok and any("single-slot reference" in d for d in failed), failed


def _matrix(v: dict, n_prompts: int, max_tokens: int) -> None:
    cell = {"kv_type": "q8_0", "depth": 0, "acceptance": 0.9, "acceptance_ci95": [0.88, 0.92], "speedup": 1.3,
            "speedup_ci95": [1.2, 1.4], "identical_output_fraction": 1.0, "verdict": "pass"}
    v["matrix"] = {"kind": "matrix", "verdict": "pass", "suite": {"name": "chat-v1", "sha256": "4d" * 32,
                                                                   "n_prompts": n_prompts},
                   "settings": {"draft_n_max": 4, "seeds": [42], "max_tokens": max_tokens}, "cells": [cell]}


def test_a_passing_matrix_cell_needs_the_evidence_minimum(tmp_path):
    ok, _ = _audited(tmp_path / "a", lambda v: _matrix(v, 54, 128))
    assert ok
    ok, failed = _audited(tmp_path / "b", lambda v: _matrix(v, 2, 16))
    assert not ok and any("matrix's passing cells rest on too little evidence" in d for d in failed), failed


def test_the_verdict_names_both(tmp_path):
    art = synth_artifact(tmp_path)
    v = honest_statement(art, acceptance=0.9)["predicate"]["verification"]
    bad = copy.deepcopy(v)
    _slots(bad, 0.5, [0.1, 0.9])
    _matrix(bad, 2, 16)
    reasons = judge_recorded(bad)[1]
    assert sum("single-slot reference" in r or "too little evidence" in r for r in reasons) == 2, reasons
