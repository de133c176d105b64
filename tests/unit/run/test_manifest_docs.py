"""docs/provenance.md's schema table names every manifest key (a stale doc is a liar too, docs/triage.md#8)."""

from __future__ import annotations

import re

from align.run.manifest import key_paths
from tests.conftest import REPO


def documented_keys() -> set[str]:
    keys: set[str] = set()
    for line in (REPO / "docs" / "provenance.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", line.split("|")[1])
        group = names[0].split(".")[0] if "." in names[0] else ""
        keys |= {f"{group}{n}" if n.startswith(".") else n for n in names}
    return keys


def test_every_manifest_key_is_documented():
    missing = sorted(set(key_paths()) - documented_keys())
    assert not missing, f"docs/provenance.md schema table lacks {missing}"
