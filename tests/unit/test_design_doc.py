"""docs/design.md keeps up with the code: every rule id cited under src/ is defined there, and
every src/ and tests/ path it names exists (with the test it names, for `path::name`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design.md"

# a rule id as the code cites it: R-BAT-5, or a bare area such as R-SC (not inside a longer word)
RULE_ID = re.compile(r"(?<![A-Za-z0-9])R-[A-Z]+(?:-[0-9]+)?")
# a path the doc names, optionally followed by ::test_name
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:src|tests)/[\w./-]*[\w/])(?:::(\w+))?")
NOT_BUILT = "not built yet"


def cited_in_src() -> dict[str, list[str]]:
    """Rule id → the src files that cite it (comments, docstrings, anywhere in the source)."""
    cited: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        for rule in set(RULE_ID.findall(path.read_text(encoding="utf-8"))):
            cited.setdefault(rule, []).append(str(path.relative_to(ROOT)))
    return cited


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def table_rows(text: str) -> dict[str, list[str]]:
    """Rule id → the cells of its table row (the row's first cell is exactly the id)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if cells and RULE_ID.fullmatch(cells[0]):
            assert cells[0] not in rows, f"{cells[0]} has two rows in docs/design.md"
            rows[cells[0]] = cells
    return rows


def heading_ids(text: str) -> set[str]:
    return {rule for line in text.splitlines() if line.startswith("#") for rule in RULE_ID.findall(line)}


def test_src_cites_rules_at_all() -> None:
    """Guards the check below against a regex or a layout that finds nothing."""
    cited = cited_in_src()
    assert "R-BAT-5" in cited and "R-SC" in cited, sorted(cited)


def test_every_rule_cited_in_src_is_defined_in_the_design_doc() -> None:
    text = doc_text()
    rows, headings = table_rows(text), heading_ids(text)
    missing = []
    for rule, files in sorted(cited_in_src().items()):
        numbered = re.fullmatch(r"R-[A-Z]+-[0-9]+", rule) is not None
        # a numbered id needs its own table row; a bare area id (R-SC) a heading naming it
        if (numbered and rule not in rows) or (not numbered and rule not in headings):
            missing.append(f"{rule} (cited in {', '.join(files)})")
    assert not missing, "rule ids cited under src/ but not defined in docs/design.md:\n" + "\n".join(missing)


def test_every_rule_row_names_an_owner_and_a_proof_or_says_not_built() -> None:
    problems = []
    for rule, cells in table_rows(doc_text()).items():
        if len(cells) != 4:
            problems.append(f"{rule}: {len(cells)} cells, want id | rule | owner | proof")
            continue
        _, _, owner, proof = cells
        if "src/" not in owner and NOT_BUILT not in owner:
            problems.append(f"{rule}: the owner names no src/ module and does not say {NOT_BUILT!r}")
        if "tests/" not in proof and NOT_BUILT not in proof:
            problems.append(f"{rule}: the proof names no tests/ file and does not say {NOT_BUILT!r}")
    assert not problems, "\n".join(problems)


def test_every_path_named_in_the_design_doc_exists() -> None:
    missing = []
    named = NAMED_PATH.findall(doc_text())
    assert named, "docs/design.md names no src/ or tests/ path"
    for rel, name in sorted(set(named)):
        path = ROOT / rel
        if not path.exists():
            missing.append(f"{rel}: no such file or folder")
            continue
        if name:
            source = path.read_text(encoding="utf-8") if path.is_file() else ""
            defined = re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^{name}\s*=", source, re.MULTILINE)
            if not defined:
                missing.append(f"{rel}::{name}: no such test in that file")
    assert not missing, "docs/design.md names what does not exist (moved or renamed?):\n" + "\n".join(missing)
