"""One arm: prompts rendered as training renders them, completions exactly the engine's, metrics of
the right shape; the oracle scores 100% and its shuffled control the chance rate."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from align.data.sources import bundled_gsm8k
from align.evaluation.config import EvalConfig
from align.evaluation.datasets import load_data
from align.evaluation.runner import evaluate, oracle_arm, render, stop_ids
from align.evaluation.scoring import build_scorer
from align.generation import EngineConfig, SamplingSpec, build_engine


@pytest.fixture(scope="module")
def loaded(tiny_export):
    from align.evaluation.model_source import resolve_source

    return resolve_source(str(tiny_export), "model_dir").load(torch.device("cpu"), torch.float32)[:2]


def test_prompts_render_as_training_renders_a_user_turn(loaded):
    from align.data.encode import encode_one
    from align.data.sources import Record

    _, tok = loaded
    data = load_data(EvalConfig(limit=3))
    for item, ids in zip(data.items, render(tok, data.items, "{prompt}")):
        train_ids, mask = encode_one(tok, Record(id="x", root="x", messages=[
            {"role": "user", "content": item.prompt}, {"role": "assistant", "content": item.reference}]))
        first_target = mask.index(True)
        assert train_ids[:first_target] == ids  # the prompt is what training conditioned the answer on


def test_greedy_completions_are_the_engines_and_the_mode_is_restored(loaded):
    model, tok = loaded
    cfg = EvalConfig(limit=3, max_new_tokens=6)
    model.train()
    out = evaluate(model, tok, cfg, "cpu", engine_cfg=EngineConfig(batch_size=2))
    assert model.training
    data = load_data(cfg)
    engine = build_engine(EngineConfig(batch_size=2), model, pad_token_id=tok.pad_token_id,
                          eos_token_ids=[tok.eos_token_id])
    ref = engine.generate(render(tok, data.items, cfg.template), SamplingSpec(max_new_tokens=6, temperature=0))
    texts = [tok.decode(list(c.token_ids), skip_special_tokens=True) for c in ref]
    assert [per[0]["text"] for per in out["samples"]] == texts
    assert set(out["metrics"]) == {"pass@1", "accuracy", "extraction_failed", "finished_at_length", "mean_new_tokens"}
    assert out["engine"]["backend"] == "align" and out["data"]["records"] == 3


def test_sampled_runs_report_pass_and_maj_at_k_and_repeat_by_seed(loaded):
    model, tok = loaded
    cfg = EvalConfig(limit=2, max_new_tokens=5, samples=4)
    a, b = evaluate(model, tok, cfg, "cpu"), evaluate(model, tok, cfg, "cpu")
    c = evaluate(model, tok, EvalConfig(limit=2, max_new_tokens=5, samples=4, seed=1), "cpu")
    assert {"pass@1", "pass@2", "pass@4", "maj@2", "maj@4"} <= set(a["metrics"])
    texts = lambda r: [[s["text"] for s in per] for per in r["samples"]]  # noqa: E731
    assert texts(a) == texts(b) and texts(a) != texts(c)
    assert all([s["sample"] for s in per] == [0, 1, 2, 3] for per in a["samples"])


def test_evaluate_refuses_a_model_on_another_device(loaded):
    model, tok = loaded
    with pytest.raises(ValueError, match="is on cpu"):
        evaluate(model, tok, EvalConfig(limit=1), "cuda")


def test_stop_ids_take_the_models_generation_config_too():
    tok = SimpleNamespace(eos_token_id=2)
    assert stop_ids(tok, SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, 2]))) == [2, 7]
    assert stop_ids(tok, SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))) == [2]


def _plain_final(answer: str) -> str:
    """The reference number read without align's code: the chance rate must not trust what it tests."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def test_the_oracle_scores_every_reference_and_its_shuffle_scores_chance():
    cfg = EvalConfig()
    scorer = build_scorer(cfg)
    data = load_data(cfg, scorer.verifier)
    assert oracle_arm(data, cfg, scorer).metrics["pass@1"] == 1.0
    shuffled = EvalConfig(oracle=True, oracle_shuffle=True, seed=3)
    got = oracle_arm(data, shuffled, scorer)
    finals = [_plain_final(json.loads(line)["answer"]) for line in bundled_gsm8k("test").open()]
    pairs = [(s["index"], s["text"]) for per in got.samples for s in per]
    assert all(text != data.items[i].reference for i, text in pairs)  # a derangement: nobody keeps its own
    perm = [next(j for j, it in enumerate(data.items) if it.reference == text) for _, text in pairs]
    chance = sum(finals[i] == finals[j] for i, j in enumerate(perm)) / len(finals)
    assert got.metrics["pass@1"] == pytest.approx(chance) and chance < 0.05


def test_oracle_with_k_samples_is_perfect_at_every_k():
    cfg = EvalConfig(limit=20, samples=4, oracle=True)
    scorer = build_scorer(cfg)
    m = oracle_arm(load_data(cfg, scorer.verifier), cfg, scorer).metrics
    assert all(m[k] == 1.0 for k in ("pass@1", "pass@2", "pass@4", "maj@2", "maj@4"))


def test_random_shuffle_is_not_a_seed_free_path():
    # the shuffled pairing depends on eval.seed only, never on the global random stream
    cfg = EvalConfig(limit=50, oracle=True, oracle_shuffle=True)
    scorer = build_scorer(cfg)
    data = load_data(cfg, scorer.verifier)
    random.seed(1)
    a = [s["text"] for per in oracle_arm(data, cfg, scorer).samples for s in per]
    random.seed(2)
    b = [s["text"] for per in oracle_arm(data, cfg, scorer).samples for s in per]
    assert a == b
