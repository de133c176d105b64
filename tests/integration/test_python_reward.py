"""Python rewards on the tiny model: the GRPO run of docs/rewards.md's worked example (two functions of
examples/rewards.py and a verifier) trains on their weighted sum, reports each part in its history and
records each function's import path and source hash in the manifest; a function that fails mid-run
(`reward=python`, the one-function shorthand) stops the run with one line naming the prompt, exit 2."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.conftest import REPO, recorded_run, run_cli

EXAMPLE = REPO / "examples" / "rewards.py"
SMALL = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.device=cpu",
         "data.max_records=64"]
WORKED = {"answer": f"{EXAMPLE}:concise_answer", "brevity": f"{EXAMPLE}:brevity"}
"""docs/rewards.md's worked example, weighted {answer: 1.0, brevity: 0.2, exact_int: 0.5}."""


def test_a_grpo_run_trains_on_its_functions_and_records_each_ones_part_and_hash(tmp_path):
    import examples.rewards as example
    from align.rewards import get_verifier

    overrides = [*SMALL, "reward=exact_int", "reward.weights.exact_int=0.5", "trainer.max_steps=2",
                 *[f"+reward.functions.{n}={s}" for n, s in WORKED.items()], "+reward.weights.answer=1.0",
                 "+reward.weights.brevity=0.2"]
    t, run_dir = recorded_run(tmp_path, overrides)
    r, obj = t.objective.rollout, t.objective
    # the last rollout's rewards are the weighted sum of what each function returns on its decoded completions
    # and of the verifier's scores, prompt by prompt
    ids = [r.tokens[r.offsets[s] + r.prompt_lens[s]:r.offsets[s + 1]].tolist() for s in range(r.size)]
    texts = [t.tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    prompts = [obj.prompts.texts[row] for row in r.rows]
    answer = example.concise_answer(prompts=prompts, completions=texts,
                                    answer=[obj.prompts.columns[row]["answer"] for row in r.rows])
    brevity = example.brevity(prompts=prompts, completions=texts, completion_ids=ids)
    exact = [get_verifier("exact_int").score(c, obj.prompts.references[row]).value for c, row in zip(texts, r.rows)]
    want = [a + 0.2 * b + 0.5 * e for a, b, e in zip(answer, brevity, exact)]
    assert r.rewards.tolist() == pytest.approx(want, abs=1e-12) and len(set(want)) > 1
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert rows[-1]["reward/mean"] == pytest.approx(np.mean(want))
    for name, values in (("answer", answer), ("brevity", brevity), ("exact_int", exact)):
        assert rows[-1][f"reward/{name}"] == pytest.approx(np.mean(values)), name
    manifest = json.loads((run_dir / "provenance.json").read_text())
    sha = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert manifest["reward"] == {n: {"function": s, "file": str(EXAMPLE), "sha256": sha} for n, s in WORKED.items()}
    assert manifest["objective"]["loss"]["reward"]["functions"] == manifest["reward"]
    assert manifest["run"]["exit_code"] == 0 and "reward" not in manifest["null_reasons"]


def test_the_worked_example_is_the_one_docs_rewards_md_shows():
    doc = (REPO / "docs" / "rewards.md").read_text()
    for name, spec in WORKED.items():
        assert f"+reward.functions.{name}={spec.removeprefix(f'{REPO}/')}" in doc and f"    {name}: " in doc, name
    assert "weights: {answer: 1.0, brevity: 0.2, exact_int: 0.5}" in doc
    assert "reward.weights.exact_int=0.5" in doc and "+reward.weights.brevity=0.2" in doc


def test_a_function_that_raises_mid_run_exits_2_naming_the_prompt(tmp_path):
    run_dir = tmp_path / "run"
    p = run_cli("align.train", *SMALL, "reward=python", "reward.function=tests.python_rewards:raises", "logger=none",
                "allow_dirty=true", "trainer.export=false", f"hydra.run.dir={run_dir}")
    assert p.returncode == 2, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("align: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "/align/data/assets/add/train.jsonl:" in errors[0], errors
    assert errors[0].endswith("reward.function tests.python_rewards:raises raised ValueError: no score for this one")
    manifest = json.loads((run_dir / "provenance.json").read_text())
    assert manifest["run"]["exit_code"] == 2
    assert manifest["reward"]["python"]["function"] == "tests.python_rewards:raises"
    assert not (run_dir / "history.jsonl").read_text().strip()  # no step was trained on a failed rollout
