"""objective=grpo through `python -m align.train`: the embedded default learns its task, and bad prompt
data is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_the_embedded_default_learns_the_addition_task(tmp_path):
    """`python -m align.train objective=grpo` as typed: the tiny random-init model's mean reward rises
    clearly from its first steps (where almost no completion scores) within the default run. A flipped
    advantage sign (the policy pushed away from what scored) fails this test."""
    run_dir = tmp_path / "run"
    p = run_cli("align.train", "objective=grpo", f"hydra.run.dir={run_dir}", "allow_dirty=true")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    rewards = [r["reward/mean"] for r in rows]
    first, last = _mean(rewards[:5]), _mean(rewards[-10:])
    assert last >= 0.1 and last >= first + 0.08, (first, last, rewards)
    for key in ("time/generation_share", "rollout/tokens_per_s", "time/update_tokens_per_s", "mismatch/logp_abs_max",
                "mismatch/kl", "mismatch/is_ratio_std", "reward/zero_variance_frac"):
        assert all(r[key] is not None for r in rows), key
    assert max(r["mismatch/logp_abs_max"] for r in rows) < 1e-4  # fp32 CPU, shared weights: no mismatch
    manifest = json.loads((run_dir / "provenance.json").read_text())
    loss = manifest["model"]["extra"]["loss"]
    assert loss["kind"] == "grpo" and loss["is_correction"] == "none" and manifest["data"]["source"] == "add"
    assert (run_dir / "export" / "model.safetensors").is_file()


def test_a_reference_the_reward_cannot_read_exits_2_naming_file_and_line(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "reference": "2"}\n{"prompt": "1+2=", "reference": "three"}\n')
    p = run_cli("align.train", "objective=grpo", "data=jsonl_prompts", f"data.path={data}", "logger=none",
                "allow_dirty=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("align: error:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"align: error: {data}:2: exact_int reference is not an integer"), errors
    assert not (tmp_path / "run" / "history.jsonl").exists()


def test_an_unknown_verifier_exits_2_before_any_work(tmp_path):
    p = run_cli("align.train", "objective=grpo", "+reward.weights.exactness=1.0", "logger=none",
                f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    assert errors == ["align: error: reward.weights.exactness: unknown verifier; accepted: exact_int, format, gsm8k, "
                      "math (got 'exactness')"], errors
    assert not (tmp_path / "run").exists()
