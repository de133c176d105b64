"""The transformers engine against references written out by hand: greedy tokens against an argmax loop,
log-probs against a teacher-forced forward on the same tokens, a left-padded batch against one prompt at
a time, seeded sampling, n per prompt, stop and length, static against dynamic cache."""

from __future__ import annotations

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from align.config import Family
from align.errors import ConfigError
from align.generation import (
    Backend,
    Engine,
    EngineConfig,
    FinishReason,
    GenerateMode,
    HFEngine,
    SamplingSpec,
    build_engine,
)
from align.models.family_table import FAMILIES
from tests.unit.generation.conftest import argmax_loop, prompts, teacher_forced_logits

EOS = 2


def engine(model, pad: int = 0, eos=(EOS,), **kw) -> HFEngine:
    return build_engine(EngineConfig(**{"backend": Backend.hf, **kw}), model, pad_token_id=pad, eos_token_ids=eos)


def test_greedy_equals_a_hand_written_argmax_loop(tiny_model):
    model = tiny_model()
    ps = prompts(4)
    out = engine(model).generate(ps, SamplingSpec(max_new_tokens=8, temperature=0, stop_token_ids=()))
    assert [c.prompt_index for c in out] == [0, 1, 2, 3]
    for c, p in zip(out, ps):
        assert list(c.token_ids) == argmax_loop(model, p, 8)
        assert c.finish_reason is FinishReason.length and c.num_tokens == 8


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logprobs_equal_a_teacher_forced_recomputation_on_the_same_tokens(tiny_model, family):
    model = tiny_model(family)
    ps = prompts(3, vocab=model.get_input_embeddings().num_embeddings)
    spec = SamplingSpec(max_new_tokens=6, temperature=0.7, top_k=40, top_p=0.9, n=2, seed=5, stop_token_ids=())
    for c in engine(model, batch_size=4).generate(ps, spec):
        tempered = teacher_forced_logits(model, ps[c.prompt_index], c.token_ids) / spec.temperature
        tokens = torch.tensor(c.token_ids)
        want = tempered.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-5, rtol=0)
        kept = TopPLogitsWarper(0.9)(None, TopKLogitsWarper(40)(None, tempered))
        want_sampler = kept.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
        assert torch.isfinite(want_sampler).all()  # every drawn token survived the truncation
        torch.testing.assert_close(torch.tensor(c.sampler_logprobs), want_sampler, atol=1e-5, rtol=0)
        assert all(s > lp for s, lp in zip(c.sampler_logprobs, c.logprobs))  # renormalised over fewer tokens


def test_greedy_logprobs_are_the_temperature_one_model_logprobs(tiny_model):
    model = tiny_model()
    ps = prompts(3)
    for c in engine(model).generate(ps, SamplingSpec(max_new_tokens=5, temperature=0, stop_token_ids=())):
        logits = teacher_forced_logits(model, ps[c.prompt_index], c.token_ids)
        want = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-5, rtol=0)
        assert c.sampler_logprobs == (0.0,) * 5  # greedy draws from a point mass


@pytest.mark.parametrize("pad", [EOS, 0], ids=["pad-is-eos", "pad-inside-a-prompt"])
@pytest.mark.parametrize("family", [Family.mistral, Family.gemma4])
def test_a_left_padded_batch_gives_what_one_prompt_at_a_time_gives(tiny_model, family, pad):
    # Given no mask, transformers infers one from the pad tokens unless pad is an EOS id, and then also
    # masks a real prompt token that equals pad: each parametrization shows a missing mask.
    model = tiny_model(family)
    ps = prompts(4, hi=14)
    ps[1][0] = pad
    spec = SamplingSpec(max_new_tokens=6, temperature=0)  # stops at the engine's EOS
    batched = engine(model, pad=pad, pad_to_multiple_of=8).generate(ps, spec)
    alone = engine(model, pad=pad, pad_to_multiple_of=1)
    for c, p in zip(batched, ps):
        [ref] = alone.generate([p], spec)
        want = argmax_loop(model, p, 6)
        want = want[:want.index(EOS) + 1] if EOS in want else want
        assert c.token_ids == ref.token_ids == tuple(want)
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(ref.logprobs), atol=1e-5, rtol=0)


def test_a_seed_repeats_its_samples_another_seed_differs_and_the_callers_rng_is_untouched(tiny_model):
    eng = engine(tiny_model(), batch_size=2)
    ps = prompts(3)
    spec = SamplingSpec(max_new_tokens=6, temperature=1.0, n=2, seed=11, stop_token_ids=())
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = eng.generate(ps, spec)
    assert torch.equal(torch.get_rng_state(), before)
    assert eng.generate(ps, spec) == first
    other = eng.generate(ps, SamplingSpec(**{**spec.__dict__, "seed": 12}))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]
    assert torch.equal(torch.get_rng_state(), before)


def test_n_completions_per_prompt_in_prompt_then_sample_order(tiny_model):
    ps = prompts(3)
    # batch_size 4 splits the 9 rows so that one prompt's completions straddle two batches
    out = engine(tiny_model(), batch_size=4).generate(ps, SamplingSpec(max_new_tokens=5, n=3, stop_token_ids=()))
    assert [(c.prompt_index, c.sample_index) for c in out] == [(p, s) for p in range(3) for s in range(3)]
    for p in range(3):
        group = {c.token_ids for c in out if c.prompt_index == p}
        assert len(group) == 3  # sampled, not copies


def test_max_new_tokens_and_stop_tokens_end_completions(tiny_model):
    model = tiny_model()
    ps = prompts(4)
    spec = SamplingSpec(max_new_tokens=8, temperature=0, stop_token_ids=())
    free = engine(model).generate(ps, spec)
    assert all(c.num_tokens == 8 and c.finish_reason is FinishReason.length for c in free)
    stop = free[0].token_ids[2]
    for stopped in (engine(model).generate(ps, SamplingSpec(max_new_tokens=8, temperature=0, stop_token_ids=(stop,))),
                    engine(model, eos=(stop,)).generate(ps, SamplingSpec(max_new_tokens=8, temperature=0))):
        for c, f in zip(stopped, free):
            if stop in f.token_ids:
                k = f.token_ids.index(stop) + 1
                assert c.finish_reason is FinishReason.stop and c.token_ids == f.token_ids[:k]
                assert c.logprobs == pytest.approx(f.logprobs[:k], abs=1e-5)
            else:
                assert c.finish_reason is FinishReason.length and c.token_ids == f.token_ids
        assert stopped[0].num_tokens <= 3


def test_static_cache_gives_the_dynamic_cache_output_on_cpu(tiny_model):
    model = tiny_model()
    ps = prompts(4)
    for spec in (SamplingSpec(max_new_tokens=7, temperature=0, stop_token_ids=()),
                 SamplingSpec(max_new_tokens=7, temperature=0.8, top_p=0.95, n=2, seed=3, stop_token_ids=())):
        dyn = engine(model, mode=GenerateMode.dynamic).generate(ps, spec)
        static = engine(model, mode=GenerateMode.static)
        assert static.describe()["cache_implementation"] == "static"
        for a, b in zip(dyn, static.generate(ps, spec)):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_checkpoints_generation_config_does_not_leak_and_the_model_is_left_as_found(tiny_model):
    model = tiny_model()
    ps = prompts(3)
    spec = SamplingSpec(max_new_tokens=6, temperature=0, stop_token_ids=())
    clean = engine(model).generate(ps, spec)
    saved = model.generation_config
    saved.repetition_penalty, saved.no_repeat_ngram_size = 50.0, 1  # what a generation_config.json may carry
    try:
        model.train()
        assert engine(model).generate(ps, spec) == clean
        assert model.training and model.generation_config is saved
    finally:
        saved.repetition_penalty, saved.no_repeat_ngram_size = None, None


def test_describe_records_what_resolved(tiny_model):
    eng = engine(tiny_model())
    assert isinstance(eng, Engine)
    d = eng.describe()
    keys = {"backend", "mode_requested", "mode", "cache_implementation", "compile", "compile_config", "device", "dtype",
            "attn_implementation", "weights", "batch_size", "pad_to_multiple_of", "pad_token_id", "eos_token_ids",
            "logprobs", "sampler_logprobs", "rng", "versions"}
    assert keys <= set(d)
    assert (d["backend"], d["mode_requested"], d["mode"], d["cache_implementation"], d["compile"]) == \
        ("hf", "auto", "dynamic", "dynamic", False)
    assert d["device"] == "cpu" and d["dtype"] == "float32" and d["attn_implementation"] == "sdpa"
    assert set(d["versions"]) == {"torch", "transformers"}
    assert d["weights"].startswith("shared")
    with pytest.raises(ConfigError, match="generation.mode: compiled needs a CUDA device"):
        engine(tiny_model(), mode=GenerateMode.compiled)


def test_a_copy_engine_syncs_from_the_training_model_and_hashes_its_weights(tiny_model, build):
    trained = tiny_model()
    other = build(seed=1).model
    shared = engine(trained)
    copy = HFEngine.copy_of(other, EngineConfig(backend=Backend.hf), pad_token_id=0, eos_token_ids=(EOS,))
    assert copy.describe()["weights"].startswith("copy") and copy.model is not other
    assert copy.weights_hash() != shared.weights_hash()
    copy.sync_from(trained)
    assert copy.weights_hash() == shared.weights_hash()
    spec = SamplingSpec(max_new_tokens=5, temperature=0, stop_token_ids=())
    assert copy.generate(prompts(2), spec) == shared.generate(prompts(2), spec)
    before = shared.weights_hash()
    shared.sync_from(trained)  # the same object: nothing to copy
    w = trained.get_input_embeddings().weight
    kept = w.detach().clone()
    with torch.no_grad():
        w[5, 0] += 1.0
    try:
        assert shared.weights_hash() != before  # a shared engine hashes the weights as they are now
    finally:
        with torch.no_grad():
            w.copy_(kept)
    assert shared.weights_hash() == before


def test_bad_prompts_are_refused_naming_the_prompt(tiny_model):
    eng = engine(tiny_model())
    spec = SamplingSpec(max_new_tokens=2, temperature=0)
    with pytest.raises(ConfigError, match=r"prompts\[1\]: is empty"):
        eng.generate([[5], []], spec)
    with pytest.raises(ConfigError, match=r"prompts\[0\]: holds token ids outside \[0, 4096\)"):
        eng.generate([[5, 4096]], spec)
