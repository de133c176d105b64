"""On CUDA: align's decode engine. The Triton live-length kernel equals the gathered-rows reference over
ragged lengths and GQA groups (bf16, and a sliding ring); the CUDA-graph path gives the eager path's
tokens and log-probs a teacher-forced forward gives, for every family's tiny preset, with its graphs and
compiled step in place (not fallen back), and a seeded sampled call repeats itself.

    python -m pytest -q -m gpu tests/gpu/test_align_engine_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from align.config import AttentionConfig, Family, ModelConfig
from align.generation import Backend, EngineConfig, GenerateMode, SamplingSpec, build_engine
from align.generation.slot_attention import _decode_triton, decode_reference
from tests.unit.generation.conftest import prompts, teacher_forced_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 8, 64), (32, 8, 128), (16, 2, 256), (8, 1, 512)])
def test_the_kernel_equals_the_reference_over_ragged_live_lengths(heads, kv_heads, head_dim):
    g = torch.Generator(device="cuda").manual_seed(0)
    slots, length, batch = 9, 300, 6
    k = torch.randn(slots, kv_heads, length, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, heads, 1, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    rows = torch.tensor([3, 0, 8, 5, 5, 1], device="cuda")
    lengths = torch.tensor([1, 63, 64, 65, 300, 17], device="cuda")
    got = _decode_triton(q, k, v, rows, lengths, head_dim ** -0.5)
    want = decode_reference(q.float(), k.float(), v.float(), rows, lengths, head_dim ** -0.5)
    assert (got.float() - want).abs().max().item() < 2e-2


def _model(family):
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    tok = load_tokenizer(ModelConfig())
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    return build_model(ModelConfig(family=family), AttentionConfig(), tok, cuda).model.to(cuda, torch.bfloat16)


def _engine(model, mode, slots=8):
    cfg = EngineConfig(backend=Backend.align, mode=mode, batch_size=slots, sync_every=4)
    return build_engine(cfg, model, pad_token_id=0, eos_token_ids=(2,))


def _drift(model, ps, out) -> tuple[float, float]:
    """Worst |log-prob - a teacher-forced forward's| and worst (max logit - the token's logit) over `out`."""
    worst_lp, worst_gap = 0.0, 0.0
    for c, p in zip(out, ps):
        logits = teacher_forced_logits(model, p, c.token_ids)
        picked = torch.tensor(c.token_ids, device=logits.device)[:, None]
        got = torch.tensor(c.logprobs, device=logits.device)
        worst_lp = max(worst_lp, (torch.log_softmax(logits, -1).gather(-1, picked)[:, 0] - got).abs().max().item())
        worst_gap = max(worst_gap, (logits.max(-1).values - logits.gather(-1, picked)[:, 0]).max().item())
    return worst_lp, worst_gap


@pytest.mark.parametrize("family", [f for f in Family if f is not Family.hf])
def test_the_compiled_graphs_decode_what_a_teacher_forced_forward_scores(family):
    """bf16 on a random model: the compiled step (inductor's fused kernels) and the eager step round
    differently and near-tied greedy tokens part ways, so tokens are not compared past the prefill's.
    Every token and log-prob must be what a plain forward over the whole sequence gives, within what
    transformers' own `generate` drifts from that forward on the same model (Gemma-4 MoE's tiny preset
    drifts 0.37 nats in bf16 on the CPU under `generate` itself): a stale or misplaced key costs more."""
    model = _model(family)
    vocab = model.get_input_embeddings().num_embeddings
    ps = prompts(12, hi=40, vocab=vocab)
    spec = SamplingSpec(max_new_tokens=20, temperature=0, stop_token_ids=())
    eager = _engine(model, GenerateMode.static).generate(ps, spec)
    graphed_engine = _engine(model, GenerateMode.compiled)
    graphed = graphed_engine.generate(ps, spec)
    d = graphed_engine.describe()
    assert d["cuda_graphs"] and d["compiled_step"], (d["cuda_graph_failure"], d["compile_failure"])
    assert d["decode_attention"] == "triton, live keys only"
    # Prompts end to end through flash's variable-length kernel wherever every head fits it (not Gemma-4's
    # 512-wide global heads, which prefill left-padded).
    wide = any(getattr(m, "head_dim", 0) > 256 for m in model.modules())
    assert d["prefill_attention"] == ("left-padded, sdpa" if wide else "packed, varlen flash"), d["prefill_attention"]
    assert [c.token_ids[0] for c in eager] == [c.token_ids[0] for c in graphed]  # one prefill path
    hf = build_engine(EngineConfig(backend=Backend.hf, mode=GenerateMode.compiled, batch_size=8), model,
                      pad_token_id=0, eos_token_ids=(2,)).generate(ps, spec)
    mine, theirs = _drift(model, ps, graphed), _drift(model, ps, hf)
    assert all(m < max(0.15, 1.5 * t) for m, t in zip(mine, theirs)), (mine, theirs)


def test_seeded_sampling_repeats_itself():
    model = _model(Family.mistral)
    ps = prompts(10, hi=30, vocab=model.get_input_embeddings().num_embeddings)
    spec = SamplingSpec(max_new_tokens=16, temperature=1.0, n=2, seed=3, stop_token_ids=())
    a = _engine(model, GenerateMode.compiled, slots=8).generate(ps, spec)
    b = _engine(model, GenerateMode.compiled, slots=8).generate(ps, spec)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]


def test_a_copy_of_training_compiled_blocks_decodes_in_one_graph_without_recompiles():
    """GRPO's engine is a bf16 copy of a policy whose decoder blocks the trainer compiled. The engine's
    compiled step must trace the whole model as one graph: a break inside a layer leaves that layer's
    attention a frame of its own, guarded on its `layer_idx`, which recompiles per layer until dynamo's
    limit (8) runs the deeper layers eager. Ten layers, so a per-layer recompile would hit the limit."""
    import torch._dynamo.utils

    from align.data.tokenizer import load_tokenizer
    from align.models import build_model
    from align.parallel.compile import compile_blocks

    tok = load_tokenizer(ModelConfig())
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    cfg = ModelConfig(family=Family.mistral, overrides={"num_hidden_layers": 10})
    policy = build_model(cfg, AttentionConfig(), tok, cuda).model.to(cuda)
    compile_blocks(policy, None)
    engine = build_engine(EngineConfig(backend=Backend.align, mode=GenerateMode.compiled, batch_size=8), policy,
                          pad_token_id=0, eos_token_ids=(2,), copy=True, copy_dtype=torch.bfloat16)
    torch._dynamo.utils.counters.clear()
    ps = prompts(8, hi=30, vocab=policy.get_input_embeddings().num_embeddings)
    engine.generate(ps, SamplingSpec(max_new_tokens=12, temperature=1.0, seed=1, stop_token_ids=()))
    d = engine.describe()
    assert d["compiled_step"] and d["compile_graph_break"] is None, (d["compile_graph_break"], d["compile_failure"])
    limit_hits = {k: v for k, v in torch._dynamo.utils.counters["unimplemented"].items()
                  if str(k).startswith("Dynamo recompile limit exceeded")}
    assert not limit_hits, limit_hits


@pytest.mark.parametrize("window", [None, 4])
def test_the_varlen_prefill_scores_what_the_left_padded_one_does(window):
    """Flash's variable-length kernel over packed prompts against SDPA over left-padded ones, on one bf16
    model: the first token (the prefill's) and its log-prob; a window of 4 under prompts up to 40 long
    checks the kernel's `window_size` says the window the model's mask says."""
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    tok = load_tokenizer(ModelConfig())
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    cfg = ModelConfig(family=Family.mistral, overrides={"sliding_window": window})
    model = build_model(cfg, AttentionConfig(), tok, cuda).model.to(cuda, torch.bfloat16)
    ps = prompts(12, lo=5, hi=40, vocab=model.get_input_embeddings().num_embeddings)
    spec = SamplingSpec(max_new_tokens=1, temperature=0, stop_token_ids=())
    packed, padded = _engine(model, GenerateMode.static), _engine(model, GenerateMode.static)
    padded.packed_prefill = False
    a, b = packed.generate(ps, spec), padded.generate(ps, spec)
    assert packed.describe()["prefill_attention"] == "packed, varlen flash"
    assert padded.describe()["prefill_attention"] == "left-padded, sdpa"
    gaps = [abs(x.logprobs[0] - y.logprobs[0]) for x, y in zip(a, b)]
    assert sum(x.token_ids == y.token_ids for x, y in zip(a, b)) >= 11 and max(gaps) < 0.05, gaps


@pytest.mark.parametrize("family", [Family.olmoe, Family.gemma4_moe])
def test_the_routing_record_rides_in_the_captured_compiled_steps(family):
    """MoE with the router record on (GRPO's flip record): the routers' hooks must not break the one-graph
    step, and what replays of the captured graphs leave in the record must be each token's own routing, as
    a forward over the whole sequence routes it (bf16: sets at near-ties may differ; a stale buffer, a row
    mix-up or an off-by-one token agrees with it far less, as the shifted comparison shows)."""
    from align.models.family_table import FAMILIES
    from tests.unit.generation.test_align_engine import _routed_by_a_teacher_forced_forward

    model = _model(family)
    ps = prompts(12, hi=40, vocab=model.get_input_embeddings().num_embeddings)
    engine = _engine(model, GenerateMode.compiled)
    engine.record_routers(FAMILIES[family].router_taps(engine.model))
    out = engine.generate(ps, SamplingSpec(max_new_tokens=20, temperature=1.0, n=2, seed=5, stop_token_ids=()))
    d = engine.describe()
    assert d["cuda_graphs"] and d["compiled_step"] and d["compile_graph_break"] is None, \
        (d["cuda_graph_failure"], d["compile_failure"], d["compile_graph_break"])
    taps = FAMILIES[family].router_taps(model)
    same = shifted = total = 0
    for c in out:
        got = c.router_topk.to("cuda").long().sort(-1).values
        want = _routed_by_a_teacher_forced_forward(model, taps, ps[c.prompt_index], c.token_ids)
        same += int((got[:, 1:] == want[:, 1:]).all(-1).sum())
        shifted += int((got[:, 1:] == want[:, :-1]).all(-1).sum())
        total += got[:, 1:].numel() // got.shape[-1]
    assert same >= 0.9 * total and shifted < 0.5 * total, (same, shifted, total)
