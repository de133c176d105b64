"""On CUDA: the compiled path (static cache, decode step under torch.compile, what `auto` resolves to
there) gives the dynamic path's greedy tokens and log-probs, really compiled, compiles nothing more on a
repeat call, and a seeded sampled call repeats itself and leaves the CUDA RNG as it found it.

    python -m pytest -q -m gpu tests/gpu/test_generation_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from align.config import AttentionConfig, Family, ModelConfig
from align.generation import EngineConfig, GenerateMode, SamplingSpec, build_engine
from tests.unit.generation.conftest import prompts, teacher_forced_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def model():
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    tok = load_tokenizer(ModelConfig())
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    # build_model's device picks the attention backend only; the random init happens on the host
    return build_model(ModelConfig(family=Family.mistral), AttentionConfig(), tok, cuda).model.to(cuda)


def engine(model, mode: GenerateMode = GenerateMode.auto):
    return build_engine(EngineConfig(mode=mode, batch_size=8), model, pad_token_id=0, eos_token_ids=(2,))


def test_compiled_greedy_gives_the_dynamic_tokens_and_compiles_once(model):
    from torch._dynamo.utils import counters

    ps = prompts(8, hi=40)
    spec = SamplingSpec(max_new_tokens=24, temperature=0, stop_token_ids=())
    dynamic = engine(model, GenerateMode.dynamic).generate(ps, spec)
    compiled = engine(model)
    d = compiled.describe()
    assert (d["mode"], d["cache_implementation"], d["compile"]) == ("compiled", "static", True)
    graphs = counters["stats"]["unique_graphs"]
    first = compiled.generate(ps, spec)
    assert counters["stats"]["unique_graphs"] > graphs, "the decode step did not compile"
    for a, b in zip(dynamic, first):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    for c in first:
        logits = teacher_forced_logits(model, ps[c.prompt_index], c.token_ids)
        want = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids, device=logits.device)[:, None])
        assert c.logprobs == pytest.approx(want.squeeze(-1).tolist(), abs=1e-4)
    graphs = counters["stats"]["unique_graphs"]
    assert compiled.generate(ps, spec) == first
    assert counters["stats"]["unique_graphs"] == graphs, "a repeat call with the same shapes recompiled"


def test_seeded_sampling_on_cuda_repeats_and_leaves_the_cuda_rng_as_found(model):
    eng = engine(model)
    ps = prompts(4)
    spec = SamplingSpec(max_new_tokens=12, temperature=1.0, top_p=0.9, n=2, seed=7, stop_token_ids=())
    before = torch.cuda.get_rng_state()
    first = eng.generate(ps, spec)
    assert torch.equal(torch.cuda.get_rng_state(), before)
    assert eng.generate(ps, spec) == first
    other = eng.generate(ps, SamplingSpec(**{**spec.__dict__, "seed": 8}))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]
