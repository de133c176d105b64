"""A trained reward model as GRPO's reward on the tiny model (`reward=model reward.path=<dir>`): the run's
rewards are the reward model's own forward of each prompt's messages and completion rendered through ITS
chat template, the step's row reports its part as `reward/model`, the manifest names it by the sha256
of its weight files, and a checkpoint records that sha256: a resume against a changed reward model is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from align.errors import ConfigError
from tests.conftest import build_trainer, recorded_run
from tests.unit.rewards.conftest import reward_model_checkpoint

SMALL = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.device=cpu",
         "data.max_records=64"]


def test_a_grpo_run_trains_on_the_reward_models_scores_and_records_its_part_and_hash(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from align.core.hashing import sha256_files

    rm = reward_model_checkpoint(tmp_path / "rm")
    t, run_dir = recorded_run(tmp_path, [*SMALL, "reward=model", f"reward.path={rm}", "reward.model_batch_size=5",
                                         "trainer.max_steps=2"])
    r, obj = t.objective.rollout, t.objective
    ids = [r.tokens[r.offsets[s] + r.prompt_lens[s]:r.offsets[s + 1]].tolist() for s in range(r.size)]
    completions = [t.tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    tok = AutoTokenizer.from_pretrained(str(rm))
    model = AutoModelForSequenceClassification.from_pretrained(str(rm), dtype=torch.float32).eval()
    want = []
    for c, row in zip(completions, r.rows):
        text = tok.apply_chat_template([*obj.prompts.messages[row], {"role": "assistant", "content": c}],
                                       tokenize=False)
        with torch.no_grad():
            want.append(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item())
    assert r.rewards.tolist() == pytest.approx(want, abs=1e-5) and len(set(want)) > 1
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert rows[-1]["reward/model"] == pytest.approx(np.mean(want), abs=1e-5)
    manifest = json.loads((run_dir / "provenance.json").read_text())
    record = manifest["reward"]["model"]
    assert record["weights_sha256"] == sha256_files([rm / "model.safetensors"], rm)
    assert record["path"] == str(rm.resolve()) and record["class"] == "MistralForSequenceClassification"
    loaded = manifest["objective"]["loss"]["reward"]["model"]
    assert (loaded["dtype"], loaded["device"], loaded["batch_size"]) == ("float32", "cpu", 5)
    assert loaded["weights_sha256"] == record["weights_sha256"]
    assert manifest["run"]["exit_code"] == 0 and "reward" not in manifest["null_reasons"]


def test_a_resume_against_a_changed_reward_model_is_refused(tmp_path):
    from align.core.hashing import sha256_files

    rm = reward_model_checkpoint(tmp_path / "rm")
    cfg = [*SMALL, "reward=model", f"reward.path={rm}", "trainer.export=false", "trainer.save_every=1"]
    assert build_trainer(tmp_path, *cfg, "trainer.max_steps=1").fit() == 0
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_00000001" / "meta.json").read_text())
    was = meta["objective"]["reward_model_sha256"]
    assert was == sha256_files([rm / "model.safetensors"], rm)  # the manifest's hash of it
    reward_model_checkpoint(rm, seed=2)  # retrained in place: the same reward.path, other weights
    now = sha256_files([rm / "model.safetensors"], rm)
    with pytest.raises(ConfigError) as e:
        build_trainer(tmp_path, *cfg, "trainer.max_steps=2")
    assert str(e.value) == (f"reward.path: the checkpoint was scored by a reward model of weights sha256 {was}, this "
                            f"run by a reward model of weights sha256 {now}: resume with the run's own reward model "
                            f"(got {str(rm)!r})")
    reward_model_checkpoint(rm)  # the run's own reward model again: the resume goes on
    assert build_trainer(tmp_path, *cfg, "trainer.max_steps=2").state.step == 1
