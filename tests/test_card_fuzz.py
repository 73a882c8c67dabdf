"""No receipt the audit accepts can crash ``card`` or the ladder card (issue #40, item 3/5).

A seeded walk (the same mutations on every machine) replaces one value at a time anywhere in an
honest verification section (modes, per-category, sweep, curve, matrix, slots, tuned, head, ...)
with a value of another shape, re-seals the receipt and runs the real audit of a real artifact:
whenever the audit passes, the card and the ladder card must render; the card is never asked to
render figures the audit did not judge."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from receipt_kit import honest_statement, slot_replies, synth_artifact

from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.card import card_text
from ggufmtp.provenance.ladder_card import ladder_card_text, ladder_rows
from ggufmtp.provenance.receipt import seal

VALUES: list[Any] = [None, "x", "", 5, -1, 0.5, 1e308, True, [], [None], [1, 2], {}, {"a": 1}, {"x": [None]}]
RICH = {  # sections verify can write, added to the honest record so the walk reaches them
    "sweep": [{"k": 2, "mode": "default", "acceptance": 0.8, "acceptance_ci95": [0.7, 0.9], "speedup": 1.2,
               "speedup_ci95": [1.1, 1.3], "identical_output_fraction": 1.0, "mismatch_count": 0,
               "per_position": [0.9, 0.7]}],
    "tuned": {"kind": "sweep", "command": "llama-server -m m.gguf --spec-draft-n-max 2", "recommended_k": 2},
    "acceptance_curve": {"points": [{"k": 1, "acceptance": 0.9, "speedup": 1.1}]},
    "slots": {"reference": {"slots": 1, "acceptance": 0.9, "acceptance_ci95": [0.88, 0.92]},
              "rows": [{"slots": 2, "acceptance": 0.9, "acceptance_ci95": [0.88, 0.92], "identical": 162,
                        "pairs": 162, "speedup": 1.3, "replies": slot_replies(162)}]},
}


def _paths(x: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(x, list):
        for i, v in enumerate(x[:3]):
            out += _paths(v, (*prefix, i))
    return out


def _set(d: Any, path: tuple, value: Any) -> None:
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    art = synth_artifact(tmp_path_factory.mktemp("fuzz"))
    st = honest_statement(art, acceptance=0.9)
    st["predicate"]["verification"].update(copy.deepcopy(RICH))
    return art, seal(st)


def test_the_honest_rich_receipt_audits_and_renders(honest, tmp_path):
    art, st = honest
    rc = tmp_path / "r.json"
    rc.write_text(json.dumps(st))
    assert audit(art, rc).ok
    card_text(st)


@pytest.mark.runtime  # 160 audits (schema, header, digest each): ~5 s, too slow for make test-fast
def test_no_receipt_the_audit_accepts_crashes_the_cards(honest, tmp_path):
    art, st = honest
    rng = random.Random(40)
    paths = _paths(st["predicate"]["verification"])
    rc = tmp_path / f"{art.name}.receipt.json"
    accepted = crashed = 0
    for i in range(160):
        mutated = copy.deepcopy(st)
        path = paths[rng.randrange(len(paths))]
        _set(mutated["predicate"]["verification"], path, copy.deepcopy(rng.choice(VALUES)))
        rc.write_text(json.dumps(seal(mutated)))
        if not audit(art, rc).ok:
            continue
        accepted += 1
        try:
            card_text(mutated)
            ladder_card_text(ladder_rows([(art, rc)]), "ladder")
        except Exception as e:  # noqa: BLE001 - any crash is the finding
            crashed += 1
            pytest.fail(f"mutation {i} at {'.'.join(map(str, path))} passed audit but crashed the card: {e!r}")
    assert accepted > 10  # the walk reached receipts the audit accepts (the test can fail)
    assert crashed == 0
