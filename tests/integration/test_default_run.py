"""The embedded default trains, learns and exports a model that transformers loads."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import run_cli


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_default_run_learns_and_exports(tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.time()
    p = run_cli("align.train", f"hydra.run.dir={run_dir}", "allow_dirty=true")
    wall = time.time() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 150 and [r["step"] for r in rows] == list(range(1, 151))
    for key in ("step", "loss", "lr", "grad_norm", "tokens", "real_tokens", "tokens_per_s"):
        assert key in rows[0]
    k = len(rows) // 10
    first, last = _mean([r["loss"] for r in rows[:k]]), _mean([r["loss"] for r in rows[-k:]])
    assert last <= 0.8 * first, (first, last)
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    print(f"default run wall time: {wall:.0f}s")  # a figure for the notes, not a gate (shared CPU)

    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(run_dir / "export", local_files_only=True)
    assert type(m).__name__ == "MistralForCausalLM"


@pytest.mark.slow
def test_olmoe_with_the_bucket_sampler_works_exactly_as_typed(tmp_path):
    run_dir = tmp_path / "run"
    p = run_cli("align.train", "model=olmoe", "sampler=bucket", f"hydra.run.dir={run_dir}", "allow_dirty=true")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    k = len(rows) // 10
    assert len(rows) == 150 and _mean([r["loss"] for r in rows[-k:]]) <= 0.8 * _mean([r["loss"] for r in rows[:k]])
    from transformers import AutoModelForCausalLM

    assert type(AutoModelForCausalLM.from_pretrained(run_dir / "export")).__name__ == "OlmoeForCausalLM"
