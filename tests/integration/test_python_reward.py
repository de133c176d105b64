"""reward=python on the tiny model: the GRPO run trains on the rewards the function returns (the documented
example, examples/rewards.py), the manifest records the function's import path and source hash, and a
function that fails mid-run stops the run with one line naming the prompt, exit 2."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.conftest import REPO, recorded_run, run_cli

EXAMPLE = REPO / "examples" / "rewards.py"
SMALL = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.device=cpu",
         "data.max_records=64", "reward=python"]


def test_a_grpo_run_trains_on_the_functions_rewards_and_records_its_hash(tmp_path):
    import examples.rewards as example

    spec = f"{EXAMPLE}:concise_answer"
    t, run_dir = recorded_run(tmp_path, [*SMALL, f"reward.function={spec}", "trainer.max_steps=2"])
    r, obj = t.objective.rollout, t.objective
    # the last rollout's rewards are what the function returns on its decoded completions, prompt by prompt
    texts = [t.tokenizer.decode(r.tokens[r.offsets[s] + r.prompt_lens[s]:r.offsets[s + 1]].tolist(),
                                skip_special_tokens=True) for s in range(r.size)]
    answers = [obj.prompts.columns[row]["answer"] for row in r.rows]
    want = example.concise_answer(prompts=[obj.prompts.texts[row] for row in r.rows], completions=texts,
                                  answer=answers)
    assert r.rewards.tolist() == pytest.approx(want, abs=0) and len(set(want)) > 1
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert rows[-1]["reward/mean"] == pytest.approx(np.mean(want)) == rows[-1]["reward/python"]
    manifest = json.loads((run_dir / "provenance.json").read_text())
    assert manifest["reward"] == {"function": spec, "file": str(EXAMPLE),
                                  "sha256": hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()}
    assert manifest["objective"]["loss"]["reward"]["python"] == manifest["reward"]
    assert manifest["run"]["exit_code"] == 0 and "reward" not in manifest["null_reasons"]


def test_a_function_that_raises_mid_run_exits_2_naming_the_prompt(tmp_path):
    run_dir = tmp_path / "run"
    p = run_cli("align.train", *SMALL, "reward.function=tests.python_rewards:raises", "logger=none",
                "allow_dirty=true", "trainer.export=false", f"hydra.run.dir={run_dir}")
    assert p.returncode == 2, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("align: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "/align/data/assets/add/train.jsonl:" in errors[0], errors
    assert errors[0].endswith("reward.function tests.python_rewards:raises raised ValueError: no score for this one")
    manifest = json.loads((run_dir / "provenance.json").read_text())
    assert manifest["run"]["exit_code"] == 2 and manifest["reward"]["function"] == "tests.python_rewards:raises"
    assert not (run_dir / "history.jsonl").read_text().strip()  # no step was trained on a failed rollout
