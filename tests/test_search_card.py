"""How a searched recipe was found, from the recipe file to the receipt and the card (#43): the
record is read strictly (a recipe is input like any other), only from the bytes the receipt's sha256
names, and rendered as the search's claims with its Pareto table and a text plot."""

from __future__ import annotations

import hashlib

from ggufmtp.provenance.search_card import SEARCH_HEADING, record_of, search_lines, search_record, text_plot

GOOD = '''name = "searched-mtp"
ftype = "Q8_0"

[search]
method = "pareto-dp"
baseline_recipe = "Q8_0"
budget_bytes = 1259648
n_bytes = 1252864
bpw = 5.07
predicted_kld = 0.0041

[search.proof]
verdict = "beats"
against = "iq2_xxs-mtp"
kld = 0.004
shipped_kld = 0.00766
kld_diff_ci95 = [-0.0040, -0.0032]
acceptance_diff = 0.015
acceptance_diff_ci95 = [0.009, 0.023]

[[search.points]]
label = "searched (predicted)"
kind = "predicted"
n_bytes = 1300000
kld = 0.0041
pareto = true

[[search.points]]
label = "searched-mtp (proved)"
kind = "proved"
n_bytes = 1300100
kld = 0.0040
pareto = true

[[search.points]]
label = "iq2_xxs-mtp (proved)"
kind = "proved"
n_bytes = 1306900
kld = 0.00766
pareto = false
'''


def _write(tmp_path, text: str):
    path = tmp_path / "searched.toml"
    path.write_bytes(text.encode())
    return path, hashlib.sha256(text.encode()).hexdigest()


def test_the_record_comes_only_from_the_bytes_the_receipt_names(tmp_path):
    path, sha = _write(tmp_path, GOOD)
    rec = search_record(path, sha)
    assert rec["method"] == "pareto-dp" and rec["proof"]["verdict"] == "beats" and len(rec["points"]) == 3
    assert search_record(path, "0" * 64) is None  # the file changed since its sha256 was taken
    assert search_record(tmp_path / "missing.toml", sha) is None and search_record(None, None) is None
    plain, plain_sha = _write(tmp_path, 'name = "x"\nftype = "Q8_0"\n')
    assert search_record(plain, plain_sha) is None  # a recipe that was not searched


def test_a_hostile_search_table_keeps_only_known_keys_of_the_right_types():
    rec = record_of({
        "method": "pareto-dp", "baseline_recipe": "Q8_0\n## injected heading", "corpus": "a|b",
        "bpw": float("nan"), "predicted_kld": True, "budget_bytes": -5, "n_bytes": 10, "token": "hf_secret",
        "proof": {"verdict": "beats", "kld_diff_ci95": [0.1], "acceptance_diff_ci95": ["x", 1], "kld": float("inf"),
                  "reason": "`rm -rf /`", "extra": 1},
        "points": [{"label": "ok", "kind": "proved", "n_bytes": 1, "kld": 0.1, "pareto": True},
                   {"label": "<script>", "kind": "proved", "n_bytes": 1, "kld": 0.1, "pareto": True},
                   {"label": "neg", "kind": "proved", "n_bytes": 1, "kld": -1.0, "pareto": True},
                   {"label": "kind", "kind": "evil", "n_bytes": 1, "kld": 0.1, "pareto": True},
                   "not a point"] + [{"label": f"p{i}", "kind": "candidate", "n_bytes": i, "kld": 0.1, "pareto": False}
                                     for i in range(100)]})
    assert set(rec) == {"method", "n_bytes", "proof", "points"}
    assert rec["proof"] == {"verdict": "beats"}
    assert rec["points"][0]["label"] == "ok" and len(rec["points"]) == 36  # the first 40 entries, 4 refused
    assert schema_errors_of(rec) == []
    assert record_of({"proof": {"verdict": "beats"}}) is None and record_of("method") is None  # no method: none


def schema_errors_of(search: dict) -> list[str]:
    """The receipt schema's errors for ``search`` as a recipe's ``search`` field (only those)."""
    from ggufmtp.provenance.receipt import schema

    sub = schema()["properties"]["predicate"]["properties"]["recipe"]["properties"]["search"]
    import jsonschema

    return [e.message for e in jsonschema.Draft202012Validator(sub).iter_errors(search)]


def test_the_schema_takes_a_record_and_refuses_unknown_fields():
    rec = record_of(__import__("tomllib").loads(GOOD)["search"])
    assert schema_errors_of(rec) == []
    assert schema_errors_of({**rec, "note": "x"}) and schema_errors_of({**rec, "points": [{"label": "x"}]})


def test_the_card_section_labels_the_search_s_claims_and_plots_them():
    rec = record_of(__import__("tomllib").loads(GOOD)["search"])
    lines = search_lines(rec, "searched-mtp")
    text = "\n".join(lines)
    assert lines[0].startswith(SEARCH_HEADING) and "`searched-mtp` was found by `ggufmtp search` (pareto-dp" in text
    assert "This file's audit does not judge them." in text
    assert "Its proof against `iq2_xxs-mtp`: **beats**." in text and "+1.5 pts (95% CI +0.9 to +2.3)" in text
    assert "| searched-mtp (proved) | proved |" in text and "```text" in text
    assert search_lines(None, "x") == [] and search_lines({}, "x") == []


def test_the_text_plot_puts_each_kind_where_its_size_and_kld_are():
    pts = [{"label": "a", "kind": "candidate", "n_bytes": 0, "kld": 0.0, "pareto": True},
           {"label": "b", "kind": "predicted", "n_bytes": 100, "kld": 1.0, "pareto": False},
           {"label": "c", "kind": "proved", "n_bytes": 50, "kld": 0.5, "pareto": False}]
    lines = text_plot(pts, width=11, height=5)
    grid = [line.split("|", 1)[1] for line in lines[:5]]
    assert grid[4][0] == "."  # the smallest size at KLD 0: bottom left
    assert grid[0][10] == "o"  # the largest at 1.0 of a 1.05 top (3.81 of 4 rows: the top row), right
    assert grid[2][5] == "*"  # half the size at 0.5 (1.90 of 4 rows): the middle
    assert text_plot([]) == []
    same = text_plot([{**pts[0]}, {**pts[0], "kind": "proved"}], width=5, height=3)
    assert "#" in "".join(same[:3])  # two points on one cell
