"""align's decode engine (`Backend.align`) on the CPU reference path against references written out by
hand: greedy tokens against transformers' `generate` and an argmax loop for every family, log-probs against
a teacher-forced forward, seeded draws that do not depend on the batch, continuous batching that returns
every completion to its prompt, sliding-window rings, the fingerprint of a copy, refusals, and the
device sampler against transformers' warpers."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from align.config import Family
from align.errors import ConfigError
from align.generation import (
    AlignEngine,
    Backend,
    EngineConfig,
    FinishReason,
    GenerateMode,
    SamplingSpec,
    build_engine,
    derive_seed,
)
from align.generation.align_engine import _State
from align.generation.device_sampling import Law, uniforms
from align.generation.fingerprint import fingerprint
from align.models.family_table import FAMILIES
from tests.unit.generation.conftest import argmax_loop, prompts, teacher_forced_logits

EOS = 2


def align_engine(model, batch_size: int = 3, sync_every: int = 2, eos=(EOS,), packed=None) -> AlignEngine:
    """`packed`: prefill the prompts end to end in one row (the CPU takes the block-diagonal mask path);
    None: as the engine chooses (left-padded on the CPU)."""
    cfg = EngineConfig(backend=Backend.align, batch_size=batch_size, sync_every=sync_every)
    engine = build_engine(cfg, model, pad_token_id=0, eos_token_ids=eos)
    if packed is not None:
        engine.packed_prefill = packed
    return engine


def hf_engine(model, eos=(EOS,)):
    return build_engine(EngineConfig(backend=Backend.hf, mode=GenerateMode.dynamic), model, pad_token_id=0,
                        eos_token_ids=eos)


def vocab_of(model) -> int:
    return model.get_input_embeddings().num_embeddings


def truncated_at(tokens, stops) -> tuple[int, ...]:
    """`tokens` up to and including the first stop id (all of them when none occurs)."""
    tokens = tuple(tokens)
    ends = [i for i, t in enumerate(tokens) if t in stops]
    return tokens[:ends[0] + 1] if ends else tokens


def redrawn(model, prompt, completion, spec: SamplingSpec, p: int, s: int) -> tuple[int, ...]:
    """What row (p, s) draws from the teacher-forced logits of `completion`: the engine's sampler fed the
    reference logits and the stream `derive_seed(spec.seed, p, s)` at steps 0, 1, ..."""
    state, law = _sampler(model, spec)
    steps = torch.arange(len(completion))
    logits = teacher_forced_logits(model, prompt, completion)
    return tuple(state._draw(logits, torch.full_like(steps, derive_seed(spec.seed, p, s)), steps, law)[0].tolist())


# ------------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize("packed", [False, True], ids=["left-padded", "packed"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_equals_transformers_generate_and_an_argmax_loop_with_slots_reused(tiny_model, family, packed):
    model = tiny_model(family)
    ps = prompts(7, hi=14, vocab=vocab_of(model))  # 7 prompts through 3 slots: three waves
    spec = SamplingSpec(max_new_tokens=8, temperature=0, stop_token_ids=())
    eng = align_engine(model, batch_size=3, sync_every=2, packed=packed)
    out = eng.generate(ps, spec)
    ref = hf_engine(model).generate(ps, spec)
    assert [c.prompt_index for c in out] == list(range(7))
    assert eng.last_call["rows"] == 7 and eng.last_call["decode_steps"] > 8  # more than one wave ran
    for c, r, p in zip(out, ref, ps):
        assert list(c.token_ids) == list(r.token_ids) == argmax_loop(model, p, 8)
        assert c.finish_reason is FinishReason.length
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)
        assert c.sampler_logprobs == (0.0,) * 8  # greedy draws from a point mass


# ---------------------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logprobs_equal_a_teacher_forced_recomputation(tiny_model, family):
    model = tiny_model(family)
    ps = prompts(3, vocab=vocab_of(model))
    eng = align_engine(model, batch_size=4, sync_every=3)  # n=2: two prompts at once, the third refills
    truncated = SamplingSpec(max_new_tokens=6, temperature=0.7, top_k=40, top_p=0.9, n=2, seed=5, stop_token_ids=())
    plain = SamplingSpec(max_new_tokens=6, temperature=1.3, n=2, seed=5, stop_token_ids=())
    for spec in (truncated, plain):
        for c in eng.generate(ps, spec):
            assert c.token_ids == redrawn(model, ps[c.prompt_index], c.token_ids, spec, c.prompt_index, c.sample_index)
            tempered = teacher_forced_logits(model, ps[c.prompt_index], c.token_ids) / spec.temperature
            tokens = torch.tensor(c.token_ids)
            want = tempered.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-5, rtol=0)
            kept = tempered
            if spec.top_k:
                kept = TopKLogitsWarper(spec.top_k)(None, kept)
            if spec.top_p < 1:
                kept = TopPLogitsWarper(spec.top_p)(None, kept)
            want_sampler = kept.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
            assert torch.isfinite(want_sampler).all()  # every drawn token survived the truncation
            torch.testing.assert_close(torch.tensor(c.sampler_logprobs), want_sampler, atol=1e-5, rtol=0)
            if spec is plain:
                assert c.sampler_logprobs == c.logprobs
            else:
                assert all(s > lp for s, lp in zip(c.sampler_logprobs, c.logprobs))  # renormalised


# ------------------------------------------------------------------------------------------ seeds


def test_a_seed_repeats_across_engines_and_batch_shapes_another_differs_the_callers_rng_untouched(tiny_model):
    model = tiny_model()
    ps = prompts(5, hi=14)
    spec = SamplingSpec(max_new_tokens=8, temperature=1.0, n=2, seed=11, stop_token_ids=())
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = align_engine(model, batch_size=2, sync_every=1).generate(ps, spec)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(7)  # the global stream is not where the draws come from
    assert align_engine(model, batch_size=2, sync_every=1).generate(ps, spec) == first
    torch.set_rng_state(before)
    for p in range(len(ps)):  # each sample draws from its own stream
        assert first[2 * p].token_ids != first[2 * p + 1].token_ids
    # A row's draws hash (seed, prompt, sample, step): the slot count and the sync interval are not in them.
    # These fp32 CPU forwards give the same tokens and log-probs for 2, 5 and 16 rows at once.
    for batch_size in (2, 5, 16):
        for sync_every in (1, 7):
            got = align_engine(model, batch_size=batch_size, sync_every=sync_every).generate(ps, spec)
            assert [c.token_ids for c in got] == [c.token_ids for c in first], (batch_size, sync_every)
            for a, b in zip(got, first):
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    other = align_engine(model, batch_size=16).generate(ps, SamplingSpec(**{**spec.__dict__, "seed": 12}))
    assert sum(a.token_ids != b.token_ids for a, b in zip(other, first)) == len(first)
    assert torch.equal(torch.get_rng_state(), before)


# ------------------------------------------------------------------------------- continuous batching


def _static_waves_steps(lengths: list[int], wave: int, sync_every: int) -> int:
    """Decode steps of the same rows run as waves one after another, `wave` rows each in order, each wave
    held until its longest row is done (the first token comes from the prefill; the host looks every
    `sync_every` steps and runs at least one interval per wave)."""
    total = 0
    for start in range(0, len(lengths), wave):
        longest = max(lengths[start:start + wave])
        total += sync_every * max(1, math.ceil((longest - 1) / sync_every))
    return total


def test_continuous_batching_returns_each_greedy_completion_to_its_prompt(tiny_model):
    model = tiny_model()
    ps = prompts(10, lo=2, hi=24, seed=1)
    steps = 12
    free = [argmax_loop(model, p, steps) for p in ps]
    # Stop ids that this model emits at different steps: prompt i's token at step (5 i) mod 11, for two
    # prompts in three; a stop id may also end another prompt's completion (the reference truncates there).
    stops = tuple(dict.fromkeys(free[i][(5 * i) % 11] for i in range(len(ps)) if i % 3 != 2))
    # And the last token of a completion that runs to the limit, emitted nowhere else: a stop at the last
    # step is a stop, not a length.
    unstopped = [f for f in free if not set(f) & set(stops)]
    stops += (next(f[-1] for f in unstopped if sum(t == f[-1] for g in free for t in g) == 1),)
    want = [truncated_at(f, stops) for f in free]
    lengths = [len(w) for w in want]
    assert len(set(lengths)) >= 4 and min(lengths) < steps  # ragged
    assert {w[-1] in stops for w in want if len(w) == steps} == {True, False}  # a stop at the last step too

    slots, sync_every = 3, 2
    eng = align_engine(model, batch_size=slots, sync_every=sync_every, eos=stops)  # the engine's own EOS ids
    out = eng.generate(ps, SamplingSpec(max_new_tokens=steps, temperature=0))
    alone = align_engine(model, batch_size=1, sync_every=1, eos=stops)
    for p, c in enumerate(out):
        assert (c.prompt_index, c.sample_index) == (p, 0)
        [solo] = alone.generate([ps[p]], SamplingSpec(max_new_tokens=steps, temperature=0))
        assert c.token_ids == solo.token_ids == want[p]
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(solo.logprobs), atol=1e-5, rtol=0)
        reason = FinishReason.stop if want[p][-1] in stops else FinishReason.length
        assert c.finish_reason is reason == solo.finish_reason
    bound = _static_waves_steps(lengths, slots, sync_every)
    assert eng.last_call["decode_steps"] < bound, (eng.last_call, bound)  # freed slots took waiting prompts
    assert eng.last_call["decode_steps"] % sync_every == 0


def test_continuous_batching_keeps_each_sampled_row_with_its_prompt_and_sample(tiny_model):
    model = tiny_model()
    ps = prompts(6, lo=2, hi=20, seed=2)
    base = dict(max_new_tokens=10, temperature=1.0, n=3, seed=4)
    # One wave, no stop: every row's full stream of draws.
    spec = SamplingSpec(**base, stop_token_ids=())
    free = align_engine(model, batch_size=18, sync_every=10).generate(ps, spec)
    for c in free:  # each row's tokens are its own stream's draws
        assert c.token_ids == redrawn(model, ps[c.prompt_index], c.token_ids, spec, c.prompt_index, c.sample_index)
    stops = tuple(dict.fromkeys(c.token_ids[(3 * i) % 9] for i, c in enumerate(free) if i % 4 != 3))
    want = [truncated_at(c.token_ids, stops) for c in free]
    lengths = [len(w) for w in want]
    assert len(set(lengths)) >= 4 and 10 in lengths and min(lengths) < 10

    slots, sync_every = 7, 3  # two prompts' 3 samples at a time, one slot spare; 18 rows
    eng = align_engine(model, batch_size=slots, sync_every=sync_every)
    out = eng.generate(ps, SamplingSpec(**base, stop_token_ids=stops))
    assert [(c.prompt_index, c.sample_index) for c in out] == [(p, s) for p in range(6) for s in range(3)]
    for c, f, w in zip(out, free, want):
        assert c.token_ids == w
        assert c.logprobs == pytest.approx(f.logprobs[:len(w)], abs=1e-5)
        assert c.finish_reason is (FinishReason.stop if w[-1] in stops else FinishReason.length)
    # Waves of two prompts (six rows), each held to its longest row, against refilled slots.
    per_prompt = [max(lengths[3 * p:3 * p + 3]) for p in range(6)]
    bound = _static_waves_steps(per_prompt, 2, sync_every)
    assert eng.last_call["decode_steps"] < bound, (eng.last_call, bound)


def _routed_by_a_teacher_forced_forward(model, taps, prompt, completion) -> torch.Tensor:
    """[routers, len(completion), k] the experts a forward over prompt + completion routes the positions
    that predicted each completion token to (sorted within each set)."""
    from align.objectives.router_flips import RouterRecorder

    with RouterRecorder(model, taps).record() as rec:
        teacher_forced_logits(model, prompt, completion)
    n = len(prompt)
    return torch.stack([rec.calls[t.layer][0][n - 1:n - 1 + len(completion)] for t in taps]).sort(-1).values


@pytest.mark.parametrize("packed", [False, True], ids=["left-padded", "packed"])
@pytest.mark.parametrize("family", [Family.olmoe, Family.gemma4_moe])
def test_recorded_routing_is_each_rows_own_through_continuous_batching(tiny_model, family, packed):
    """MoE: each completion's `router_topk` holds the experts a teacher-forced forward over its own prompt and
    tokens routes them to (fp32: the same sets), with ragged rows refilling 5 slots; against the record
    shifted by one token most sets differ, so agreement is not routers that pick alike everywhere."""
    model = tiny_model(family)
    taps = FAMILIES[family].router_taps(model)
    assert taps
    ps = prompts(5, lo=2, hi=16, vocab=vocab_of(model), seed=3)
    base = dict(max_new_tokens=7, temperature=1.0, n=2, seed=9)
    free = align_engine(model, batch_size=10).generate(ps, SamplingSpec(**base, stop_token_ids=()))
    stops = tuple(dict.fromkeys(c.token_ids[i % 5] for i, c in enumerate(free) if i % 3 != 2))
    eng = align_engine(model, batch_size=5, sync_every=2, packed=packed)
    eng.record_routers(FAMILIES[family].router_taps(eng.model))
    out = eng.generate(ps, SamplingSpec(**base, stop_token_ids=stops))
    assert len({c.num_tokens for c in out}) >= 3 and eng.describe()["router_topk"].endswith(f"{len(taps)} MoE routers")
    same = shifted = total = 0
    for c in out:
        got = c.router_topk.long().sort(-1).values
        want = _routed_by_a_teacher_forced_forward(model, taps, ps[c.prompt_index], c.token_ids)
        assert got.shape == want.shape == (len(taps), c.num_tokens, want.shape[-1])
        same += int((got == want).all(-1).sum())
        shifted += int((got[:, 1:] == want[:, :-1]).all(-1).sum())
        total += got[:, 1:].shape[0] * got[:, 1:].shape[1]
    assert same == sum(len(taps) * c.num_tokens for c in out)
    assert shifted < 0.5 * total, (shifted, total)
    assert all(c.router_topk is None for c in free)  # not asked: no record


# ------------------------------------------------------------------------------------ sliding rings


@pytest.mark.parametrize("packed", [False, True], ids=["left-padded", "packed"])
@pytest.mark.parametrize("family", [Family.mistral, Family.gemma4])
def test_a_sliding_window_ring_gives_transformers_greedy_tokens(build, family, packed):
    model = build(family, overrides={"sliding_window": 4}).model
    windows = model.config.layer_types if family is Family.gemma4 else None
    ps = prompts(5, lo=6, hi=15, vocab=vocab_of(model))  # every prompt longer than the window
    spec = SamplingSpec(max_new_tokens=10, temperature=0, stop_token_ids=())
    eng = align_engine(model, batch_size=2, sync_every=3, packed=packed)
    out = eng.generate(ps, spec)
    ring = eng._state.cache.ring
    if windows is None:
        assert set(ring.values()) == {4}
    else:  # Gemma-4: sliding layers keep a ring of 4, the full layer every position
        assert {ring[i] == 4 for i, t in enumerate(windows) if i in ring} == {True, False}
        assert all((ring[i] == 4) == (t == "sliding_attention") for i, t in enumerate(windows) if i in ring)
    for c, r, p in zip(out, hf_engine(model).generate(ps, spec), ps):
        assert list(c.token_ids) == list(r.token_ids) == argmax_loop(model, p, 10)
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)
    assert eng.describe()["prefill_attention"] == ("packed, sdpa block-diagonal" if packed else "left-padded, sdpa")


@pytest.mark.parametrize("packed", [False, True], ids=["left-padded", "packed"])
def test_gemma4_layers_that_share_keys_give_transformers_greedy_tokens(build, packed):
    """Gemma-4's last layers read the keys an earlier layer wrote (`num_kv_shared_layers`); prompts of
    different lengths, so a left-padded prefill has padding those layers must not read."""
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    shared = {"num_hidden_layers": 4, "layer_types": types, "num_kv_shared_layers": 2}
    model = build(Family.gemma4, overrides=shared).model
    assert any(getattr(m, "is_kv_shared_layer", False) for m in model.modules())
    ps = prompts(5, lo=3, hi=15, vocab=vocab_of(model))
    spec = SamplingSpec(max_new_tokens=8, temperature=0, stop_token_ids=())
    out = align_engine(model, batch_size=3, sync_every=2, packed=packed).generate(ps, spec)
    for c, r, p in zip(out, hf_engine(model).generate(ps, spec), ps):
        assert list(c.token_ids) == list(r.token_ids) == argmax_loop(model, p, 8)
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------ weights copy


def test_the_fingerprint_catches_a_stale_copy_until_it_syncs(build):
    trained = build().model
    cfg = EngineConfig(backend=Backend.align, batch_size=2)
    copy = AlignEngine.copy_of(trained, cfg, dtype=torch.float32, pad_token_id=0, eos_token_ids=(EOS,))
    assert copy.model is not trained and copy.describe()["weights"].startswith("copy")
    assert copy.weights_hash() == fingerprint(trained.state_dict().items())
    spec = SamplingSpec(max_new_tokens=6, temperature=0, stop_token_ids=())
    before = copy.generate(prompts(2), spec)
    with torch.no_grad():
        trained.model.layers[0].self_attn.q_proj.weight[0, 0] += 0.5
    assert copy.weights_hash() != fingerprint(trained.state_dict().items())  # stale
    copy.sync_from(trained)
    assert copy.weights_hash() == fingerprint(trained.state_dict().items())
    shared = align_engine(trained, batch_size=2)
    assert copy.generate(prompts(2), spec) == shared.generate(prompts(2), spec)
    assert [c.logprobs for c in before] != [c.logprobs for c in shared.generate(prompts(2), spec)]


# -------------------------------------------------------------------------------------- refusals


def test_bad_calls_are_refused_in_one_line_before_the_cache_is_allocated(tiny_model):
    eng = align_engine(tiny_model(), batch_size=2)
    greedy = SamplingSpec(max_new_tokens=2, temperature=0)
    cases = [
        ([[5]], SamplingSpec(max_new_tokens=2, n=3), r"^generation\.batch_size: .*sampling\.n \(got 2\)$"),
        ([[5], []], greedy, r"^prompts\[1\]: is empty"),
        ([[5, 4096]], greedy, r"^prompts\[0\]: holds token ids outside \[0, 4096\)"),
        ([[3], [-1, 5]], greedy, r"^prompts\[1\]: holds token ids outside"),
    ]
    for ps, spec, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            eng.generate(ps, spec)
        assert "\n" not in str(err.value)
        assert eng._state is None


def test_a_model_without_k_proj_is_refused_naming_the_backend():
    from transformers import Phi3Config, Phi3ForCausalLM

    # Phi-3 fuses q, k and v into one `qkv_proj`: the slot cache cannot read its key shape.
    config = Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=EOS)
    model = Phi3ForCausalLM(config)
    with pytest.raises(ConfigError, match=r"^generation\.backend: align's engine cannot run this model "
                                          r"\(Phi3ForCausalLM has no attention layers with a k_proj") as err:
        align_engine(model)
    assert "\n" not in str(err.value)
    auto = build_engine(EngineConfig(), model, pad_token_id=0, eos_token_ids=(EOS,))  # auto falls back, and says so
    assert auto.describe()["backend"] == "hf" and auto.describe()["backend_requested"] == "auto"
    assert "no attention layers with a k_proj" in auto.describe()["backend_reason"]


# ------------------------------------------------------------------------------------ the sampler


def test_uniforms_lie_in_the_open_interval_and_differ_per_key_and_step():
    keys = torch.tensor([0, 1, 2, 1 << 32, (1 << 32) + 1, (1 << 63) - 1, 0x5DEECE66D << 20])
    steps = torch.tensor([0, 1, 2, 255, 1 << 31])
    grid = uniforms(keys[:, None].expand(-1, len(steps)).flatten(), steps.repeat(len(keys)))
    assert grid.dtype == torch.float32 and ((grid > 0) & (grid < 1)).all()
    assert grid.unique().numel() == grid.numel()  # keys differing only above bit 32 included
    seeds = torch.tensor([derive_seed(3, p, s) for p in range(100) for s in range(2)])  # the engine's row keys
    many = uniforms(seeds.repeat_interleave(5), torch.arange(5).repeat(200))
    assert many.unique().numel() == many.numel()
    counts = torch.histc(uniforms(torch.arange(20000), torch.zeros(20000, dtype=torch.long)), bins=10, min=0, max=1)
    assert ((counts - 2000) ** 2 / 2000).sum() < 27.9  # chi-square, 9 degrees of freedom, p = 0.001


def _sampler(model, spec: SamplingSpec):
    """The engine's sampling state set for `spec`, and the sampler branch `AlignEngine.generate` picks."""
    state = _State(model, 1, 64, 64, torch.device("cpu"))
    state.set_call(spec, ())
    return state, Law(greedy=spec.greedy, truncated=spec.top_k > 0 or spec.top_p < 1)


def _draws(model, logits: torch.Tensor, draws: int, spec: SamplingSpec):
    """`draws` samples of each row of `logits` through the engine's sampler set for `spec`, each from its
    own key: (token, logprob, sampler logprob), each (rows, draws)."""
    rows, vocab = logits.shape
    state, law = _sampler(model, spec)
    keys = torch.arange(rows * draws) * 7919 + 13
    out = state._draw(logits.repeat_interleave(draws, 0), keys, torch.zeros_like(keys), law)
    return tuple(t.view(rows, draws) for t in out)


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * tokens.numel()
    observed = torch.bincount(tokens, minlength=probs.numel()).double()
    assert observed[expected == 0].sum() == 0
    live = expected > 0
    return float(((observed[live] - expected[live]) ** 2 / expected[live]).sum())


def test_the_inverse_cdf_draws_follow_the_probabilities(tiny_model):
    probs = torch.tensor([0.05, 0.1, 0.2, 0.25, 0.4], dtype=torch.float64)
    logits = probs.log().float()[None]
    token, lp, sp = _draws(tiny_model(), logits, 20000, SamplingSpec(temperature=1.0))
    assert _chi_square(token.flatten(), probs) < 18.47  # 4 degrees of freedom, p = 0.001
    torch.testing.assert_close(lp, probs.log().float()[token], atol=1e-6, rtol=0)
    assert torch.equal(sp, lp)
    hot = probs.sqrt() / probs.sqrt().sum()  # temperature 2
    token, _, _ = _draws(tiny_model(), logits, 20000, SamplingSpec(temperature=2.0))
    assert _chi_square(token.flatten(), hot) < 18.47
    kept = torch.tensor([0, 0, 0.2, 0.25, 0.4], dtype=torch.float64)  # top-3
    token, lp, sp = _draws(tiny_model(), logits, 20000, SamplingSpec(temperature=1.0, top_k=3))
    assert _chi_square(token.flatten(), kept / kept.sum()) < 13.82  # 2 degrees of freedom
    torch.testing.assert_close(sp, (kept / kept.sum()).log().float()[token], atol=1e-6, rtol=0)


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (5, 1.0), (4, 0.8), (0, 0.3), (1, 1.0), (7, 0.55)])
def test_top_k_and_top_p_keep_what_transformers_warpers_keep_ties_included(tiny_model, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    random = torch.randn(24, 10, generator=g) * 1.5
    coarse = (torch.randn(24, 10, generator=g) * 2).round() / 2  # many ties, some at the cut
    ties = torch.tensor([[2., 2., 2., 1., 1., 1., 0., 0., 0., 0.], [1., 2., 1., 2., 1., 2., 0., 0., 0., 0.],
                         [0.] * 10, [3., 1., 1., 1., 1., 1., 1., 1., 1., -9.]])
    logits = torch.cat([random, coarse, ties])
    want = logits
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p)(None, want)
    want = want.log_softmax(-1)
    token, lp, sp = _draws(tiny_model(), logits, 3000, SamplingSpec(temperature=1.0, top_k=top_k, top_p=top_p))
    for row in range(logits.shape[0]):
        drawn = set(token[row].tolist())
        kept = set(torch.isfinite(want[row]).nonzero().flatten().tolist())
        likely = {t for t in kept if want[row, t].exp() >= 0.01}  # drawn in 3000 tries but with p < 1e-13
        assert likely <= drawn <= kept, (row, logits[row].tolist(), drawn, kept)
        torch.testing.assert_close(sp[row], want[row, token[row]], atol=1e-5, rtol=0)
        torch.testing.assert_close(lp[row], logits[row].log_softmax(-1)[token[row]], atol=1e-5, rtol=0)


def test_describe_names_the_decode_attention_that_ran(tiny_model):
    eng = align_engine(tiny_model())
    assert eng.describe()["decode_attention"] is None  # nothing decoded yet: nothing claimed
    eng.generate(prompts(2), SamplingSpec(max_new_tokens=3, temperature=0, stop_token_ids=()))
    d = eng.describe()
    assert d["decode_attention"] == "sdpa over gathered rows" and d["cuda_graphs"] is False
    assert d["last_call"]["rows"] == 2 and d["cache_bytes"] > 0


def test_in_bf16_the_engine_drifts_from_a_teacher_forced_forward_no_more_than_generate(tiny_model):
    """Gemma-4 MoE's tiny preset in bf16: decode and a whole-sequence forward route near-tied tokens to
    different experts, so even transformers' `generate` is off a teacher-forced forward by tenths of a nat.
    align's engine must be off by no more (the GPU test holds the compiled step to the same yardstick)."""
    from align.config import Family

    model = copy.deepcopy(tiny_model(Family.gemma4_moe)).to(torch.bfloat16)
    ps = prompts(6, hi=30, vocab=model.get_input_embeddings().num_embeddings)
    spec = SamplingSpec(max_new_tokens=12, temperature=0, stop_token_ids=())

    def drift(out):
        worst = 0.0
        for c, p in zip(out, ps):
            lp = torch.log_softmax(teacher_forced_logits(model, p, c.token_ids), -1)
            got = lp.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            worst = max(worst, (got - torch.tensor(c.logprobs)).abs().max().item())
        return worst

    mine, theirs = drift(align_engine(model).generate(ps, spec)), drift(hf_engine(model).generate(ps, spec))
    assert mine <= max(1e-2, 1.5 * theirs), (mine, theirs)


def test_a_reserved_cache_is_allocated_once_for_the_longest_call(tiny_model):
    """GRPO reserves its planned rollout width: a longer prompt later reuses the cache (and on CUDA the
    steps captured on it) instead of reallocating."""
    eng = align_engine(tiny_model())
    eng.reserve(200, 16)
    spec = SamplingSpec(max_new_tokens=4, temperature=0, stop_token_ids=())
    eng.generate([[5, 6, 7]], spec)
    first = eng._state
    assert first.cache.max_len == 256 and first.max_new == 64  # rounded up to the slot multiple
    eng.generate([[5] * 150], spec)
    assert eng._state is first
