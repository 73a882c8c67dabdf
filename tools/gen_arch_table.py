#!/usr/bin/env python3
"""Write the architecture tables of docs/concepts/architectures.md (issue #21) from a run of tests/test_arch_matrix.py.

Usage::

    .venv/bin/python tools/gen_arch_table.py                 # run the tests (junit), rewrite the table
    .venv/bin/python tools/gen_arch_table.py --junit r.xml   # from an earlier junit run instead
    .venv/bin/python tools/gen_arch_table.py --check         # exit 1 when the page's table is not the fresh one

Each test of tests/test_arch_matrix.py records, as junit properties, the cell it is: ``arch``,
``stage``, ``table`` (``mtp``: the architectures with an MTP graph; ``no-mtp``: the others) and,
for a stage the pinned llama.cpp cannot do (the test then asserts that failure), ``pinned`` with
the reason. A cell reads ``pass``, ``xfail: <reason>`` (pinned, or an xfail mark), ``skip: ...``
or ``FAIL``, and links to the test file with the test id as the link's title, so
``test_the_readme_table_names_only_tests_of_this_file`` can check every cell against the tests.
The table lies between ``<!-- arch-table:begin -->`` and ``<!-- arch-table:end -->``; nothing
else in README.md is touched. Exit status: 1 when a cell is ``FAIL`` or missing (the table is
still written, so the failure is visible), or with ``--check`` when the table differs.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "docs" / "concepts" / "architectures.md"  # the docs page that holds the tables
TEST_FILE = "tests/test_arch_matrix.py"
CELL_LINK = "#cells-and-tests"  # a cell links to the page's explanation; its title is the test id
BEGIN, END = "<!-- arch-table:begin -->", "<!-- arch-table:end -->"
DRIFT_TEST = "test_the_readme_table_names_only_tests_of_this_file"  # checks the README: not a cell
TABLE_TITLES = {
    "mtp": "",
    "no-mtp": "Architectures without an MTP graph in the pinned llama.cpp (an MTP recipe must be refused):",
}
FAIL, MISSING = "FAIL", "missing"
_CELL = re.compile(r'^\[(?P<outcome>[^\]]*)\]\((?P<path>[^ )]+) "(?P<id>[^"]+)"\)$')


@dataclass(frozen=True)
class Cell:
    """One table cell: the test that fills it and what it said."""

    test_id: str
    outcome: str  # "pass", "xfail: <reason>", "skip: <reason>", "FAIL", or "missing"

    def markdown(self) -> str:
        return f'[{self.outcome}]({CELL_LINK} "{self.test_id}")' if self.test_id else self.outcome


@dataclass(frozen=True)
class Row:
    arch: str
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Table:
    kind: str  # a key of TABLE_TITLES
    columns: tuple[str, ...]  # the stages, in test order
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Result:
    """One junit test case: its id, the cell properties it recorded, its outcome text."""

    test_id: str
    props: dict[str, str]
    outcome: str


# ----------------------------------------------------------------------------- junit -> tables


def run_tests(junit: Path) -> int:
    """Run the matrix (not the README check) with a junit report; returns pytest's exit status."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
            f"--junitxml={junit}", TEST_FILE, "--deselect", f"{TEST_FILE}::{DRIFT_TEST}"]
    return subprocess.run(argv, cwd=ROOT).returncode


def _clean(text: str) -> str:
    """A reason fit for a table cell and a link text: one line, no brackets, pipes or quotes."""
    text = " ".join(text.split())
    return text.translate(str.maketrans({"[": "(", "]": ")", "|": "/", '"': "'"}))


def _outcome(case: ET.Element, props: dict[str, str]) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return FAIL
    skipped = case.find("skipped")
    if skipped is not None:
        why = _clean(skipped.get("message", "")).removeprefix("xfail").strip(" :-")
        return f"xfail: {why}" if skipped.get("type") == "pytest.xfail" else f"skip: {why}"
    return f"xfail: {_clean(props['pinned'])}" if props.get("pinned") else "pass"


def read_junit(path: Path) -> list[Result]:
    """The test cases of ``path`` that recorded a cell (``arch`` and ``stage`` properties)."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        if "arch" in props and "stage" in props:
            out.append(Result(case.get("name", ""), props, _outcome(case, props)))
    return out


def _ordered(values: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def build_tables(results: list[Result]) -> list[Table]:
    """One table per ``table`` property: rows and columns in the order the tests ran."""
    tables = []
    for kind in _ordered([r.props.get("table", "mtp") for r in results]):
        mine = [r for r in results if r.props.get("table", "mtp") == kind]
        columns = _ordered([r.props["stage"] for r in mine])
        by_cell: dict[tuple[str, str], Result] = {}
        for r in mine:
            key = (r.props["arch"], r.props["stage"])
            if key in by_cell:
                raise SystemExit(f"error: {r.test_id} and {by_cell[key].test_id} both fill cell {key}")
            by_cell[key] = r
        rows = tuple(Row(arch, tuple(Cell(by_cell[(arch, c)].test_id, by_cell[(arch, c)].outcome)
                                     if (arch, c) in by_cell else Cell("", MISSING) for c in columns))
                     for arch in _ordered([r.props["arch"] for r in mine]))
        tables.append(Table(kind, columns, rows))
    return tables


# ----------------------------------------------------------------------------- markdown


def render(tables: list[Table]) -> str:
    """The block between the markers (markers excluded)."""
    parts = []
    for t in tables:
        lines = [TABLE_TITLES.get(t.kind, f"{t.kind}:"), ""] if TABLE_TITLES.get(t.kind, t.kind) else []
        lines += ["| architecture | " + " | ".join(t.columns) + " |", "|---" * (len(t.columns) + 1) + "|"]
        lines += [f"| {row.arch} | " + " | ".join(c.markdown() for c in row.cells) + " |" for row in t.rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _split_row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _parse_table(lines: list[str], kind: str) -> Table:
    columns = tuple(_split_row(lines[0])[1:])
    rows = []
    for line in lines[2:]:
        arch, *cells = _split_row(line)
        parsed = []
        for text in cells:
            m = _CELL.match(text)
            parsed.append(Cell(m["id"], m["outcome"]) if m else Cell("", text))
        rows.append(Row(arch, tuple(parsed)))
    return Table(kind, columns, tuple(rows))


def readme_tables(readme: str) -> list[Table]:
    """The tables between the markers of ``readme`` (a cell that is not a test link has no test id)."""
    block = readme_block(readme)
    tables, current, kind = [], [], "mtp"
    for line in block.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
            continue
        if current:
            tables.append(_parse_table(current, kind))
            current = []
        kind = next((k for k, title in TABLE_TITLES.items() if title and line.strip() == title), kind)
    return tables


def readme_block(readme: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"error: {README.relative_to(ROOT)} lacks the markers {BEGIN} / {END}")
    return readme.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def with_block(readme: str, block: str) -> str:
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{rest.split(END, 1)[1]}"


# ----------------------------------------------------------------------------- main


def _problems(tables: list[Table]) -> list[str]:
    return [f"{row.arch} / {col}: {cell.outcome} ({cell.test_id or 'no test'})"
            for t in tables for row in t.rows for col, cell in zip(t.columns, row.cells)
            if cell.outcome in (FAIL, MISSING)]


def fresh_tables(junit: Path | None) -> list[Table]:
    if junit is not None:
        return build_tables(read_junit(junit))
    with tempfile.TemporaryDirectory(prefix="arch-table-") as d:
        path = Path(d) / "junit.xml"
        rc = run_tests(path)
        if not path.exists():
            raise SystemExit(f"error: pytest wrote no junit report (exit status {rc})")
        return build_tables(read_junit(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", type=Path, help="read this junit report instead of running the tests")
    ap.add_argument("--check", action="store_true", help="only compare README's table with the fresh one")
    ap.add_argument("--readme", type=Path, default=README)
    args = ap.parse_args(argv)
    tables = fresh_tables(args.junit)
    if not tables:
        raise SystemExit("error: no test recorded a cell")
    readme = args.readme.read_text()
    block = render(tables)
    if args.check:
        old = readme_block(readme)
        if old != block:
            sys.stderr.writelines(difflib.unified_diff(old.splitlines(True), block.splitlines(True),
                                                       "README.md", "fresh"))
            print("\nerror: README's architecture table is stale: run tools/gen_arch_table.py", file=sys.stderr)
            return 1
        print("README's architecture table is current")
    else:
        args.readme.write_text(with_block(readme, block))
        print(f"wrote {sum(len(t.rows) for t in tables)} rows into {args.readme}")
    problems = _problems(tables)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
