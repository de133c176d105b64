"""The bundled preference set: scripts/make_gsm8k_pairs.py regenerates it byte for byte from bundled
GSM8K train, its licence travels with it, and each rejected side differs from its chosen side only in
the final answer (the "#### N" line and the last N of the reasoning)."""

from __future__ import annotations

import importlib.util
import json
import re

from align.data.sources import bundled_gsm8k, bundled_gsm8k_pairs
from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location("make_gsm8k_pairs", REPO / "scripts" / "make_gsm8k_pairs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_script_regenerates_the_committed_file_exactly():
    mod = _script()
    rows = mod.build(mod.SRC, mod.PAIRS, mod.SEED)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert mod.OUT == bundled_gsm8k_pairs() and mod.SRC == bundled_gsm8k("train")
    assert text == bundled_gsm8k_pairs().read_text(), "run scripts/make_gsm8k_pairs.py and commit the result"
    # Another seed changes the answers, not the selection: the seed is what the file depends on.
    other = mod.build(mod.SRC, 50, mod.SEED + 1)
    assert [r["prompt"] for r in other] == [r["prompt"] for r in rows[:50]]
    assert [r["rejected"] for r in other] != [r["rejected"] for r in rows[:50]]


def test_small_and_licensed():
    path = bundled_gsm8k_pairs()
    assert path.stat().st_size < 4 * 2**20
    licence = path.parent / "LICENSE"
    assert licence.read_text() == (bundled_gsm8k("train").parent / "LICENSE").read_text()
    assert "MIT" in licence.read_text() and "MIT" in (path.parent / "SOURCE.md").read_text()


def test_rejected_differs_from_chosen_only_in_the_final_answer():
    rows = [json.loads(line) for line in bundled_gsm8k_pairs().read_text().splitlines()]
    assert len(rows) == 2000
    train = {json.loads(line)["question"]: json.loads(line)["answer"] for line in bundled_gsm8k("train").open()}
    for r in rows:
        assert train[r["prompt"]] == r["chosen"], "chosen is the reference solution"
        n = re.search(r"#### (\d+)$", r["chosen"]).group(1)
        m = re.search(r"#### (\d+)$", r["rejected"]).group(1)
        assert m != n
        # The last N of the reasoning (a whole number, not digits of another) becomes M, and nothing else.
        body = r["chosen"][: -len(f"\n#### {n}")]
        i = max(x.start() for x in re.finditer(rf"(?<![\d.,]){n}(?!\d|[.,]\d)", body))
        assert body[:i] + m + body[i + len(n):] + f"\n#### {m}" == r["rejected"]
