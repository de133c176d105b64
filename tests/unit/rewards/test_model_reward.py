"""A trained reward model as a GRPO reward (`reward=model reward.path=<dir>`, align/rewards/model_reward.py):
its scores are the class's own forward of each text alone, rendered through the reward model's own chat
template; preflight refuses what cannot score before any weight is read; the config holds `model` in
`reward.weights` to `reward.path` and counts the reward model as able to vary."""

from __future__ import annotations

import pytest
import torch

from align.errors import ConfigError
from tests.unit.rewards.conftest import RM_TEMPLATE, reward_model_checkpoint


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return reward_model_checkpoint(tmp_path_factory.mktemp("rm") / "export")


MESSAGES = [[{"role": "user", "content": "What is 2 + 3?"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 40 and 2, please."}],
            [{"role": "user", "content": "1+1="}]]
COMPLETIONS = ["5", "The sum of forty and two is 42, so the answer is 42.", "", "2", "two", "It is 2 #### 2"]


def test_the_scorer_is_the_classifiers_own_forward_of_each_text_alone_through_its_own_template(rm_dir):
    """Batched with right padding, in batches that cut across texts of several lengths, each reward equals
    AutoModelForSequenceClassification's forward of that text alone (no pad) at 1e-5 in fp32; the text is the
    reward model's template (not the policy's) over the prompt's messages and the completion as the assistant."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from align.objectives.scoring_model import load_model_reward

    messages = [MESSAGES[i % len(MESSAGES)] for i in range(len(COMPLETIONS))]
    scorer = load_model_reward(str(rm_dir), "cpu", batch_size=4)
    got = scorer.score(messages, COMPLETIONS)
    tok = AutoTokenizer.from_pretrained(str(rm_dir))
    assert tok.chat_template == RM_TEMPLATE
    model = AutoModelForSequenceClassification.from_pretrained(str(rm_dir), dtype=torch.float32).eval()
    want = []
    for m, c in zip(messages, COMPLETIONS):
        text = tok.apply_chat_template([*m, {"role": "assistant", "content": c}], tokenize=False)
        assert text.endswith(f"assistant says: {c}\n{tok.eos_token}")
        with torch.no_grad():
            want.append(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item())
    assert got == pytest.approx(want, abs=1e-5)
    assert len({round(v, 4) for v in want}) == len(want)  # the texts score apart: a misread one would show
    identity = scorer.identity()
    assert (identity["dtype"], identity["device"], identity["batch_size"]) == ("float32", "cpu", 4)
    assert not any(p.requires_grad for p in scorer.model.parameters()) and not scorer.model.training


def test_the_files_identity_hashes_the_weight_files(rm_dir):
    from align.core.hashing import sha256_files
    from align.rewards.model_reward import file_identity

    identity = file_identity(str(rm_dir))
    assert identity["weights_sha256"] == sha256_files([rm_dir / "model.safetensors"], rm_dir)
    assert identity["weight_files"] == ["model.safetensors"]
    assert identity["class"] == "MistralForSequenceClassification" and identity["chat_template_sha256"]


def _check(compose, path):
    from align.config import to_typed
    from align.run.preflight_checks import check_reward

    cfg = to_typed(compose(["objective=grpo", "reward=model", f"reward.path={path}"]))
    [check] = list(check_reward(cfg, None))
    return check


def test_preflight_passes_a_reward_model_export(compose, rm_dir):
    check = _check(compose, rm_dir)
    assert check.ok and "MistralForSequenceClassification, num_labels=1" in check.detail, check.detail


def _causal_lm(d):
    from tests.conftest import tiny_checkpoint

    return tiny_checkpoint(d)


@pytest.mark.parametrize("make, says", [
    (lambda d: d / "missing", "no such directory: {d}/missing (accepted: the export dir of an objective=reward_model"),
    (_causal_lm, "{d}/config.json names architectures ['MistralForCausalLM'], not a sequence classifier: a "
                 "reward model is a ...ForSequenceClassification class with num_labels=1"),
    (lambda d: reward_model_checkpoint(d, num_labels=2), "{d}/config.json has num_labels=2: a reward model gives "
                                                         "one scalar per text, num_labels=1"),
    (lambda d: reward_model_checkpoint(d, template=None), "the reward model's tokenizer ({d}) cannot render a prompt "
                                                          "and its completion through its chat template"),
], ids=["missing", "causal_lm", "num_labels", "no_template"])
def test_preflight_refuses_what_cannot_score_in_one_line_naming_reward_path(compose, tmp_path, make, says):
    d = tmp_path / "rm"
    path = make(d)
    check = _check(compose, path)
    assert not check.ok
    e = check.error()
    assert isinstance(e, ConfigError) and "\n" not in str(e)
    assert str(e).startswith(f"reward.path: {says.format(d=d)}"), str(e)


@pytest.mark.parametrize("overrides, says", [
    (["reward=model"], "reward.path: reward.weights weighs model: name the reward model's export dir"),
    (["reward=exact_int", "reward.path=/runs/rm/export"],
     "reward.path: is read only when reward.weights weighs model (reward=model sets reward.weights.model: 1.0)"),
    (["reward=model", "reward.path=/rm", "+reward.functions.model=tests.python_rewards:recorded"],
     "reward.functions.model: model is the name of the reward model (reward.path)"),
    (["reward=model", "reward.path=/rm", "reward.model_batch_size=0"], "reward.model_batch_size: must be an int >= 1"),
    (["reward=exact_int", "reward.model_batch_size=8"],
     "reward.model_batch_size: ignored without reward.path (no reward model)"),
    # a reward model weighted 0 beside verifiers weighted 0: every completion scores the same
    (["reward=model", "reward.path=/rm", "reward.weights.model=0", "+reward.weights.exact_int=0"],
     "reward.weights: every completion scores 0 whatever it says"),
])
def test_a_bad_model_reward_config_is_one_line_naming_the_key(compose, overrides, says):
    from align.config import to_typed

    with pytest.raises(ConfigError) as e:
        to_typed(compose(["objective=grpo", *overrides]))
    assert one_line(e).startswith(says), str(e.value)


def test_a_reward_path_under_an_objective_that_reads_no_reward_is_refused(compose):
    from align.config import to_typed

    with pytest.raises(ConfigError) as e:
        to_typed(compose(["objective=sft", "reward.path=/rm"]))
    assert one_line(e).startswith("reward.path: is read by objective=grpo only; objective=sft ignores it")


def test_a_reward_model_weighted_other_than_0_is_a_reward_that_can_vary(compose):
    """The no-signal rule (align/objectives/advantages.py) counts the reward model as able to vary: beside a
    verifier weighted 0 it composes, and it is the only part."""
    from align.config import to_typed
    from align.rewards import WeightedReward

    for extra in ([], ["+reward.weights.exact_int=0"]):
        cfg = to_typed(compose(["objective=grpo", "reward=model", "reward.path=/rm", "reward.weights.model=0.5",
                                *extra]))
        assert cfg.reward.path == "/rm" and cfg.reward.weights["model"] == 0.5
        assert WeightedReward.of(cfg.reward).constant() is None


def test_the_plan_counts_the_reward_models_own_weights_and_its_forward(compose, rm_dir):
    """As objective=distill's teacher: the estimate holds the reward model's own parameters (counted here from
    the loaded model) at the bytes of the dtype it loads in on this device, and one forward of
    `reward.model_batch_size` completions (at most a generation round's), which the rollout holds beside the
    KV cache."""
    from transformers import AutoModelForSequenceClassification

    from align.config import to_typed
    from align.objectives.scoring_model import load_model_reward, scoring_dtype
    from align.plan.planner import plan

    def estimate(*overrides):
        cfg = to_typed(compose(["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4",
                                *overrides]))
        return plan(cfg, torch.device("cpu")).estimate

    rm = ["reward=model", f"reward.path={rm_dir}"]
    est = estimate(*rm, "reward.model_batch_size=4")
    n = sum(p.numel() for p in AutoModelForSequenceClassification.from_pretrained(str(rm_dir)).parameters())
    loaded = load_model_reward(str(rm_dir), "cpu", 4).identity()["dtype"]
    assert loaded == scoring_dtype("cpu") == "float32" and scoring_dtype("cuda") == "bfloat16"
    assert n != est.params.total and est.scoring_model == n * 4
    with pytest.raises(ConfigError) as e:  # preflight's plan on a path its reward model check refuses: one line
        estimate("reward=model", f"reward.path={rm_dir.parent / 'missing'}")
    assert e.value.key == "reward.path" and "to count it in the memory estimate" in one_line(e)
    plain = estimate("reward=exact_int")
    assert (plain.scoring_model, plain.scoring_activations) == (0, 0)
    assert est.total >= plain.total + est.scoring_model

    # its forward: linear in the completions per forward, capped at a round's 4 x 4 rows
    acts = {b: estimate(*rm, f"reward.model_batch_size={b}").scoring_activations for b in (2, 4, 16, 64)}
    assert acts[4] == 2 * acts[2] > 0 and acts[64] == acts[16] == 4 * acts[4]
    # long completions, one per micro-batch: the rollout (KV cache and the reward model's forward) is the peak
    wide = estimate(*rm, "reward.model_batch_size=16", "trainer.grad_accum=16", "objective.max_new_tokens=512",
                    "data.max_seq_len=640")
    assert wide.kv_cache + wide.scoring_activations > wide.activations + wide.logits + wide.grads
    assert wide.total == (wide.weights + wide.optimizer + wide.reference + wide.generation_copy
                          + wide.scoring_model + wide.kv_cache + wide.scoring_activations)
