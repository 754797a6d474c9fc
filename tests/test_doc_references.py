"""Every document the code cites is in the repository, and so is every section it cites.

Scanned: the source, test, documentation and script files of a clone (Python, stubs, Rust,
Markdown, TOML, shell, and the CI entry point). A reference is one of:

- a path to a Markdown file (`docs/design.md`, `benches/README.md`) or to anything under `docs/`:
  it must exist, from the repository's root or from the citing file's folder;
- a bare upper-case Markdown name (`README.md`): it must exist at the root or beside the citer;
- a section sign after a Markdown path (`docs/design.md` then the sign and `N`, `N-M` or `N, M`):
  the document must have a heading numbered `N.`. In a Markdown file a section sign with no
  path before it cites that file's own sections; anywhere else it cites nothing, which is an
  error (as a document the repository does not have, such as a design note kept elsewhere).

Lower-case bare names (`peers.md`) are files that srt's tools write, not documents: unchecked.
URLs are not references to the repository, nor is a section of a published standard
(`RFC 8259` then the sign and `7`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED_SUFFIXES = {".py", ".pyi", ".rs", ".md", ".toml", ".sh"}
# Folders of build outputs, environments and caches, which a clone does not have.
SKIPPED_DIRS = {".git", ".venv", "target", "build", "dist", "__pycache__", "node_modules"}
# Hidden folders are skipped but these, whose files are the repository's own.
HIDDEN_SCANNED = {".ci"}

SIGN = "\u00a7"
_NUMBERS = r"\d+(?:\s*[-\u2013]\s*\d+)?"
_SECTIONS = rf"{SIGN}\s*{_NUMBERS}(?:\s*,\s*{SIGN}?\s*{_NUMBERS})*"
# A Markdown path, optionally in backticks, then sections: `N`, `N-M`, `N, M`.
CITED_SECTIONS = re.compile(rf"([\w./-]+\.md)`?\s*({_SECTIONS})")
OWN_SECTIONS = re.compile(_SECTIONS)
STANDARD_SECTIONS = re.compile(rf"RFC\s*\d+\s*({_SECTIONS})")
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.md|docs/[\w./-]*\w)")
BARE_DOC = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_-]*\.md)\b")
URL = re.compile(r"\w+://\S+")
HEADING_NUMBER = re.compile(r"^#+\s+(\d+)\.", re.MULTILINE)


def scanned_files(root: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIPPED_DIRS
            and (not d.startswith(".") or d in HIDDEN_SCANNED)
            and not d.endswith(".egg-info")
        )
        here = Path(folder)
        for name in sorted(files):
            path = here / name
            if path.suffix in SCANNED_SUFFIXES or here.name in HIDDEN_SCANNED:
                found.append(path)
    return found


def _section_numbers(cited: str) -> set[int]:
    numbers: set[int] = set()
    for first, last in re.findall(r"(\d+)(?:\s*[-\u2013]\s*(\d+))?", cited):
        numbers.update(range(int(first), int(last or first) + 1))
    return numbers


def _resolve(reference: str, citer: Path, root: Path) -> Path | None:
    for base in (root, citer.parent):
        if (base / reference).exists():
            return base / reference
    return None


def _missing_sections(document: Path, cited: str) -> list[int]:
    headed = {int(n) for n in HEADING_NUMBER.findall(document.read_text())}
    return sorted(_section_numbers(cited) - headed)


def problems_in(text: str, citer: Path, root: Path) -> list[str]:
    """What `text` (the contents of `citer`) cites that the repository at `root` lacks."""
    text = URL.sub(" ", text)
    where = citer.relative_to(root)
    problems = []
    covered = [match.span(1) for match in STANDARD_SECTIONS.finditer(text)]
    for match in CITED_SECTIONS.finditer(text):
        reference, cited = match.groups()
        covered.append(match.span(2))
        document = _resolve(reference, citer, root)
        if document is None:
            problems.append(f"{where}: {reference}: no such file")
        elif missing := _missing_sections(document, cited):
            problems.append(f"{where}: {reference} has no section {missing}")
    for match in OWN_SECTIONS.finditer(text):
        if any(start <= match.start() < end for start, end in covered):
            continue
        if citer.suffix != ".md":
            problems.append(f"{where}: {match.group()} names no document")
        elif missing := _missing_sections(citer, match.group()):
            problems.append(f"{where}: its own section {missing} does not exist")
    for pattern in (PATH, BARE_DOC):
        for reference in pattern.findall(text):
            bare = pattern is BARE_DOC
            base = _resolve(reference, citer, root)
            if base is None or (bare and base.parent not in (root, citer.parent)):
                problems.append(f"{where}: {reference}: no such file")
    return list(dict.fromkeys(problems))


def test_every_cited_document_and_section_exists() -> None:
    problems = []
    for path in scanned_files(ROOT):
        problems += problems_in(path.read_text(errors="replace"), path, ROOT)
    assert problems == []


def test_the_scan_covers_code_tests_docs_and_scripts() -> None:
    scanned = {path.relative_to(ROOT).as_posix() for path in scanned_files(ROOT)}
    expected = {
        "README.md",
        "docs/design.md",
        "python/srt/io_struct.py",
        "python/srt/_rust.pyi",
        "rust/python/src/lib.rs",
        "rust/kernels/Cargo.toml",
        "scripts/test.sh",
        ".ci/run",
        "tests/test_layering.py",
    }
    assert expected <= scanned
    assert not any(name.split("/")[0] in SKIPPED_DIRS for name in scanned)


def test_the_checker_finds_missing_documents_and_sections(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# D\n\n## 1. One\n\n## 2. Two\n")
    citer = tmp_path / "module.py"
    good = [
        f"(docs/design.md {SIGN}1)",
        f"(`docs/design.md` {SIGN}1-2)",
        f"docs/design.md {SIGN}1, {SIGN}2",
        "see https://example.com/docs/other.md and DESIGN for the plan",
        "writes peers.md into the output folder",
        f"the characters of a JSON string (RFC 8259 {SIGN}7)",
    ]
    for text in good:
        assert problems_in(text, citer, tmp_path) == [], text
    # Split so that this file's own scan does not read them as references.
    bad = [
        f"(DESIGN {SIGN}8)",
        "DESIGN" + ".md says why",
        "docs/" + "missing.md",
        "docs/" + "grafana/missing.json",
        f"docs/design.md {SIGN}3",
        f"docs/design.md {SIGN}1-3",
        f"docs/design.md {SIGN}1, {SIGN}4",
        "other/" + f"notes.md {SIGN}1",
    ]
    for text in bad:
        assert len(problems_in(text, citer, tmp_path)) == 1, text
    # In a Markdown file, a bare section sign cites the file's own sections.
    own = tmp_path / "docs" / "design.md"
    assert problems_in(f"as {SIGN}2 says", own, tmp_path) == []
    assert len(problems_in(f"as {SIGN}5 says", own, tmp_path)) == 1
