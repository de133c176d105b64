"""Comments, docstrings and docs cite only what a reader of this repo can open: no documents kept
outside it, no work-session history, and every cited repo file (`docs/<page>.md#anchor`, `tests/...py::test`)
exists.

Scans every tracked (or new, not ignored) text file (`git ls-files`), skipping the bundled data assets and this file,
which has to spell the patterns out."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()

# Data, not prose: their text is whatever the data set says.
SKIP_PREFIXES = ("align/data/assets/", "tests/unit/probes/fixtures/profile_table")
SKIP_SUFFIXES = (".jsonl", ".json", ".parquet", ".png", ".npy", ".safetensors", ".whl")

FORBIDDEN = {
    # The patterns are assembled from parts so that this file does not match them itself.
    "a document kept outside the repo": re.compile("|".join(["LAND" + "MINES", "play" + "book", "/work/" + "shared",
                                                             r"\.\./" + "shared/", "seed" + "s/"]),
                                                   re.IGNORECASE),
    "work-session history": re.compile("|".join(["next " + "session", "earlier " + "session", r"\b[Ss]" + r"ession \d",
                                                 r"\b[Rr]" + r"ound \d+"])),
    "a page that does not exist": re.compile(r"exit-codes\.md"),
}

# A repo-relative path with an extension, not part of a longer path or a template (`<name>.yaml`).
REPO_PATH = re.compile(
    r"(?<![\w./<>$-])((?:align|tests|docs|scripts|bench|conf|launchers|\.ci)/[\w./-]*?"
    r"\.(?:py|md|yaml|sh|jsonl|json|txt|jinja|toml))(?![\w/-])(#[\w-]+)?"
)


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    files = []
    for name in out.splitlines():
        if name == SELF or name.startswith(SKIP_PREFIXES) or name.endswith(SKIP_SUFFIXES):
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        files.append(path)
    return files


def lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1))


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = doc.read_text(encoding="utf-8")
    found = set(re.findall(r'<a id="([^"]+)"', text))
    found |= {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}
    return found


FILES = tracked_text_files()


def test_the_scan_sees_code_tests_config_and_docs():
    names = {p.relative_to(REPO).as_posix() for p in FILES}
    for expected in ("align/trainer.py", "tests/conftest.py", "conf/train.yaml", "docs/pitfalls.md", "README.md",
                     "Makefile", "launchers/torchrun.sh"):
        assert expected in names


def test_nothing_cites_a_foreign_document_or_a_work_session():
    hits = [f"{p.relative_to(REPO)}:{i}: {what}: {line.strip()[:100]}"
            for p in FILES for i, line in lines(p)
            for what, pattern in FORBIDDEN.items() if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_every_cited_repo_file_anchor_and_test_exists():
    missing, cache = [], {}
    for p in FILES:
        for i, line in lines(p):
            for m in REPO_PATH.finditer(line):
                rel, anchor = m.group(1).rstrip("."), m.group(2)
                target = REPO / rel
                where = f"{p.relative_to(REPO)}:{i}: {rel}{anchor or ''}"
                test = re.match(r"::(\w+)", line[m.end():])
                if not target.exists():
                    missing.append(f"{where}: no such file")
                elif test and f"def {test.group(1)}" not in target.read_text(encoding="utf-8"):
                    missing.append(f"{where}::{test.group(1)}: no such test")
                elif anchor and rel.endswith(".md"):
                    have = cache.setdefault(rel, anchors(target))
                    if anchor[1:] not in have:
                        missing.append(f"{where}: no such anchor")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("heading, anchor", [
    ("## 1. A mask beside packed position_ids", "1-a-mask-beside-packed-position_ids"),
    ("## Exit codes", "exit-codes"),
    ("## `probe=scaling`: the 10-minute triage (docs/triage.md#3)", "probescaling-the-10-minute-triage-docstriagemd3"),
])
def test_slug_follows_githubs_anchors(heading, anchor):
    assert slug(heading.lstrip("# ")) == anchor
