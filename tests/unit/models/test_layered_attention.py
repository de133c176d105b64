"""attention=layered: chunked attention equals exact attention, the model's logits equal the eager
reference on both layer types (within and past the window, padded and not), each layer type takes
the path the manifest's plan names, and the mask gate checks what the layers get."""

from __future__ import annotations

import pytest
import torch

import align.models.layered_attention as la
from align.config import AttentionConfig, AttnImpl, Family
from tests.unit.models.conftest import batch, perturb_


def _exact(q, k, v, allowed, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    return s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("q_len, k_len, rows, window", [(10, 10, 3, None), (10, 10, 64, None), (4, 10, 3, None),
                                                         (11, 11, 4, 3), (5, 11, 2, 4), (11, 11, 64, 3)])
def test_chunked_attention_is_exact_causal_attention_with_gqa(q_len, k_len, rows, window):
    g = torch.Generator().manual_seed(0)
    shapes = ((4, q_len), (2, k_len), (2, k_len))
    q, k, v = (torch.randn(2, h, n, 8, generator=g, dtype=torch.float64) for h, n in shapes)
    qi = torch.arange(k_len - q_len, k_len)[:, None]
    allowed = torch.arange(k_len)[None, :] <= qi
    if window:
        allowed &= qi - torch.arange(k_len)[None, :] < window
    got = la.chunked_attention(q, k, v, None, 0.3, window=window, chunk_rows=rows)
    torch.testing.assert_close(got, _exact(q, k, v, allowed, 0.3))


def test_chunked_attention_applies_a_boolean_or_additive_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 9, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    allowed = (torch.arange(9)[None, :] <= torch.arange(9)[:, None]) & (torch.arange(9)[:, None] - torch.arange(9) < 4)
    allowed = allowed[None, None].expand(2, 1, 9, 9).clone()
    allowed[1, :, :, 7:] = False  # padding keys in row 1
    allowed[1, :, 7:, :] = allowed[1, :, 6:7, :]  # padding queries see what the last real one does
    want = _exact(q, k, v, allowed, 0.5)
    torch.testing.assert_close(la.chunked_attention(q, k, v, allowed, 0.5, chunk_rows=4), want)
    additive = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    torch.testing.assert_close(la.chunked_attention(q, k, v, additive, 0.5, chunk_rows=4), want)


@pytest.fixture
def paths(monkeypatch):
    """Which kernel path each call took, by (layer type, path): windowed when the call reached
    `windowed_attention`, chunked when it reached `chunked_attention` otherwise, sdpa else; the
    chunked threshold lowered so the tiny presets' global layers (head_dim 64) take it, as the full
    model's (512) do."""
    seen: set[tuple[str, str]] = set()
    monkeypatch.setattr(la, "FLASH_MAX_HEAD_DIM", 32)
    real_forward, real_chunked = la.layered_attention_forward, la.chunked_attention
    real_windowed = la.windowed_attention
    hits: dict[str, int] = {"chunked": 0, "windowed": 0}

    def counted(kind, fn):
        def inner(*a, **kw):
            hits[kind] += 1
            return fn(*a, **kw)
        return inner

    def forward(module, *a, **kw):
        before = dict(hits)
        out = real_forward(module, *a, **kw)
        path = next((k for k in ("windowed", "chunked") if hits[k] > before[k]), "sdpa")
        seen.add((module.layer_type, path))
        return out
    monkeypatch.setattr(la, "chunked_attention", counted("chunked", real_chunked))
    monkeypatch.setattr(la, "windowed_attention", counted("windowed", real_windowed))
    monkeypatch.setattr(la, "layered_attention_forward", forward)  # what build's register() installs
    yield seen
    monkeypatch.undo()
    la.register()


@pytest.mark.parametrize("family", [Family.gemma4, Family.gemma4_moe])
@pytest.mark.parametrize("width, pad", [(24, 0), (48, 0), (48, 5)])  # tiny window: 32
def test_layered_logits_equal_eager_attention_on_both_layer_types(build, family, width, pad, paths):
    eager = perturb_(build(family, AttentionConfig(implementation=AttnImpl.eager)).model).eval()
    layered = build(family, AttentionConfig(implementation=AttnImpl.auto)).model.eval()
    layered.load_state_dict(eager.state_dict())
    assert layered.config._attn_implementation == la.NAME
    ids, mask = batch(eager.config.vocab_size, s=width, pad_last=pad)
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = layered(input_ids=ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-4)
    # an unpadded row past the window takes the windowed kernel; within it, or padded, sdpa
    sliding = "windowed" if width > eager.config.sliding_window and not pad else "sdpa"
    assert {p for p in paths if p[0] == "sliding_attention"} == {("sliding_attention", sliding)}
    assert ("full_attention", "chunked") in paths


def test_the_plan_names_each_layer_types_kernel(build):
    info = build(Family.gemma4_moe).info["attention_layers"]
    assert info["sliding_attention"]["window"] == 32 and info["sliding_attention"]["layers"] == 3
    assert info["sliding_attention"]["past_window"].startswith("flash with its window")
    assert "dense mask" in info["sliding_attention"]["masked"]
    assert info["full_attention"]["layers"] == 1 and info["full_attention"]["head_dim"] == 64
    assert info["full_attention"]["unpadded"].startswith("sdpa")  # 64 <= flash's 256
    # the global layers' key/value heads are per layer (Gemma-4's per_layer_config), the query heads not
    assert (info["sliding_attention"]["heads"], info["sliding_attention"]["kv_heads"]) == (4, 2)
    assert (info["full_attention"]["heads"], info["full_attention"]["kv_heads"]) == (4, 1)
    from transformers import Gemma4TextConfig

    from align.models.family_table import _GEMMA4_MOE

    full = la.plan(Gemma4TextConfig(**_GEMMA4_MOE["full"]))
    assert full["full_attention"]["unpadded"].startswith("chunked") and full["full_attention"]["head_dim"] == 512
    assert full["sliding_attention"]["head_dim"] == 256 and full["sliding_attention"]["layers"] == 25
    assert (full["sliding_attention"]["heads"], full["sliding_attention"]["kv_heads"]) == (16, 8)
    assert (full["full_attention"]["heads"], full["full_attention"]["kv_heads"]) == (16, 2)


def _unpadded_batches(tokenizer, L: int = 48):
    """The mask gate's input: two unpadded rows of L tokens (past the tiny window, 32), through collate."""
    import numpy as np

    from align.data.collate import collate
    from align.data.encode import EncodedDataset

    data = EncodedDataset(tokens=np.arange(2 * L) % 500 + 3, loss_mask=np.ones(2 * L, dtype=bool),
                          offsets=np.array([0, L, 2 * L]), ids=["a", "b"], roots=["r", "r"])
    return {"unpadded": collate(data, np.arange(2), tokenizer.pad_token_id)}


def test_the_mask_gate_reads_a_maskless_layers_band_from_its_kernel(build, tokenizer, monkeypatch):
    """An unpadded global layer gets no mask under attention=layered and runs chunked attention, and
    an unpadded sliding layer past its window none either (the windowed kernel takes the window), so
    the gate (align/probes/mask.py) reads both bands from the kernels' output: a kernel that lets a
    query see the next key, or a window one key too wide, fails the gate."""
    from align.probes.mask import mask_report

    monkeypatch.setattr(la, "FLASH_MAX_HEAD_DIM", 32)  # the tiny global layers (64) take the chunked path
    model = build(Family.gemma4_moe).model.eval()
    batches = _unpadded_batches(tokenizer)
    report = mask_report(model, batches)
    layers = report["batches"]["unpadded"]["layers"]
    full = [lay for lay in layers if lay["type"] == "full_attention"]
    sliding = [lay for lay in layers if lay["type"] == "sliding_attention"]
    assert report["ok"] and all(lay["evidence"].startswith("the kernel") for lay in full + sliding)
    assert all(lay["max_allowed_per_row"] == 32 for lay in sliding)
    real_windowed = la.windowed_attention
    monkeypatch.setattr(la, "windowed_attention", lambda q, k, v, s, w, d=0.0: real_windowed(q, k, v, s, w + 1, d))
    wide = mask_report(model, batches)
    assert not wide["ok"] and not any(lay["ok"] for lay in wide["batches"]["unpadded"]["layers"]
                                      if lay["type"] == "sliding_attention")
    monkeypatch.setattr(la, "windowed_attention", real_windowed)
    real = la._attend
    monkeypatch.setattr(la, "_attend", lambda q, k, v, m, s, w, first: real(q, k, v, m, s, w, first + 1))
    assert not mask_report(model, batches)["ok"]


def test_dropout_is_refused_on_the_chunked_path():
    q = torch.randn(1, 2, 4, 300)
    with pytest.raises(ValueError, match="dropout"):
        la.layered_attention_forward(torch.nn.Module(), q, q, q, None, dropout=0.1)


def test_the_chunked_kernels_band_is_read_back_from_its_output(build, monkeypatch):
    model = build(Family.gemma4_moe).model
    full = next(m for m in model.modules() if getattr(m, "layer_type", None) == "full_attention")
    monkeypatch.setattr(la, "FLASH_MAX_HEAD_DIM", 32)
    band = la.observed_band(full, 48)
    assert torch.equal(band, torch.ones(48, 48, dtype=torch.bool).tril())
    monkeypatch.setattr(la, "chunked_attention", lambda q, k, v, m, s, window=None: la._attend(q, k, v, m, s, 4, 0))
    assert int(la.observed_band(full, 48).sum(-1).max()) == 4


@pytest.mark.parametrize("family", [Family.gemma4, Family.gemma4_moe])
def test_unread_kv_stores_are_dropped_and_change_nothing(build, family):
    """With no layer sharing keys and values, the last layer of each type still stored them: a write
    nobody reads and a second compiled graph per layer type. Turned off, the logits are the same."""
    from align.models.build import drop_unread_kv_stores

    b = build(family)
    assert b.info["kv_stores_dropped"] == 2  # the last sliding and the last full layer
    assert not any(getattr(m, "store_full_length_kv", False) for m in b.model.modules())
    stored = build(family).model
    for m in stored.modules():
        if hasattr(m, "store_full_length_kv"):
            m.store_full_length_kv = m.layer_idx in (2, 3)
    ids, _ = batch(b.model.config.vocab_size, s=40)
    with torch.no_grad():
        torch.testing.assert_close(b.model(input_ids=ids).logits, stored(input_ids=ids).logits, atol=0, rtol=0)
    shared = build(family).model
    for m in shared.modules():
        if hasattr(m, "store_full_length_kv"):
            m.store_full_length_kv, m.is_kv_shared_layer = m.layer_idx == 2, m.layer_idx == 3
    assert drop_unread_kv_stores(shared) == 0  # a layer reads them: kept


def test_compiled_layered_blocks_do_not_recompile_per_width(build, monkeypatch):
    """One dynamic graph per layer type and path serves every ragged width: no slice bound depends on
    the width (a loop over range(0, width, c) made a graph per width, and flex's block mask carries
    the width as a constant: both ran into dynamo's recompile limit on the GPU)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from align.parallel.compile import compile_blocks

    torch._dynamo.reset()
    counters.clear()
    model = build(Family.gemma4_moe).model.train()
    compile_blocks(model, True, backend="eager")
    monkeypatch.setattr(la, "FLASH_MAX_HEAD_DIM", 32)  # the tiny global layers (64) take the chunked path
    for width in (40, 56, 72, 88, 104):  # all past the tiny window (32)
        model(input_ids=torch.randint(3, 400, (2, width)), use_cache=False).logits.sum().backward()
    after_first = int(counters["stats"]["unique_graphs"])
    for width in (48, 64, 96, 120):
        model(input_ids=torch.randint(3, 400, (3, width)), use_cache=False).logits.sum().backward()
    assert int(counters["stats"]["unique_graphs"]) == after_first <= 4


def test_a_windowed_models_compiled_blocks_compile_within_the_expected_count(build):
    """Gemma-4's one block frame meets three guard sets: the global layers, the sliding layers past
    their window (a mask) and within it (none). The expected count says so, so the end-of-run warning
    fires for a guard that keeps failing and not for every Gemma-4 run (a GPU run warned at 3 over 2)."""
    import torch._dynamo
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER

    from align.parallel.compile import block_variants, compile_blocks, expected_compiles_per_frame, frames_over

    torch._dynamo.reset()
    model = build(Family.gemma4_moe).model.train()
    assert block_variants(model.config) == 3
    compile_blocks(model, True, backend="eager")
    for width in (40, 16, 56, 24):  # past and within the tiny window (32)
        model(input_ids=torch.randint(3, 400, (2, width)), use_cache=False).logits.sum().backward()
    compiled = max(FRAME_COMPILE_COUNTER.values())
    expected = expected_compiles_per_frame(True, True, None, block_variants(model.config))
    over = frames_over(expected)
    torch._dynamo.reset()
    assert compiled == 3 and over == []
    assert compiled > expected_compiles_per_frame(True, True, None)  # one variant's bound would warn


def test_block_variants_count_layer_types_and_windowed_ones(build):
    from align.parallel.compile import block_variants

    assert block_variants(build(Family.mistral).model.config) == 1
    assert block_variants(build(Family.olmoe).model.config) == 1


def test_the_mask_gate_reads_the_band_in_the_trainers_autocast_dtype(build, tokenizer, monkeypatch):
    """Which kernel a maskless layer runs depends on the query dtype (flash takes bf16/fp16 only), so
    the windowed kernel computes in the autocast dtype, as SDPA does, and the gate reads the band
    under the trainer's autocast: the dtype the kernel sees in training."""
    from align.probes.mask import mask_report

    model = build(Family.gemma4_moe).model.eval()
    batches = _unpadded_batches(tokenizer)
    dtypes = []
    real = la.chunked_attention  # what the windowed kernel runs on a CPU, after its autocast
    monkeypatch.setattr(la, "chunked_attention", lambda q, *a, **kw: dtypes.append(q.dtype) or real(q, *a, **kw))
    assert mask_report(model, batches)["ok"] and set(dtypes) == {torch.float32}
    dtypes.clear()
    bf16 = mask_report(model, batches, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert bf16["ok"] and set(dtypes) == {torch.bfloat16}


def test_a_cached_generation_past_the_window_equals_eager_attention(build):
    """Prefill of a prompt past the window (no mask: the kernel takes the window) then cached decode
    steps (transformers' masks), against eager attention with its dense masks: the same logits."""
    eager = perturb_(build(Family.gemma4_moe, AttentionConfig(implementation=AttnImpl.eager)).model).eval()
    layered = build(Family.gemma4_moe, AttentionConfig(implementation=AttnImpl.auto)).model.eval()
    layered.load_state_dict(eager.state_dict())
    assert eager.config.sliding_window == 32
    ids, _ = batch(eager.config.vocab_size, s=48)
    with torch.no_grad():
        want = eager.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
        got = layered.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), atol=2e-5, rtol=1e-4)
    assert torch.equal(got.sequences, want.sequences)


def _saved_bytes(fn):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        out = fn()
    return sum(saved), out


def test_a_row_past_one_pass_keeps_no_probabilities_for_backward_and_the_same_gradients():
    """A row wider than `chunk_rows` recomputes each pass in backward: what autograd keeps is the
    inputs, not [H, chunk, K] probabilities per pass (at 16 heads and a 16,384-token row those were
    about 24 GiB per global layer); values and gradients are those of one pass over the whole row."""
    g = torch.Generator().manual_seed(0)

    def run(rows):
        q, k, v = (torch.randn(1, h, 64, 8, generator=torch.Generator().manual_seed(i), requires_grad=True)
                   for i, h in enumerate((4, 2, 2)))
        saved, out = _saved_bytes(lambda: la.chunked_attention(q, k, v, None, 0.3, window=24, chunk_rows=rows))
        (out * torch.randn(out.shape, generator=g.manual_seed(1))).sum().backward()
        return saved, out, [t.grad for t in (q, k, v)]

    one_saved, one_out, one_grads = run(64)
    chunked_saved, chunked_out, chunked_grads = run(16)
    probabilities = 4 * 64 * 64 * (4 + 4)  # one pass keeps its fp32 probabilities and their value-dtype copy
    inputs = 4 * (4 * 16 * 8 + 2 * 64 * 8 + 2 * 64 * 8) * 4  # per pass: its queries, all keys and values
    assert one_saved > probabilities and chunked_saved == inputs, (one_saved, chunked_saved)
    torch.testing.assert_close(chunked_out, one_out)
    for a, b in zip(chunked_grads, one_grads):
        torch.testing.assert_close(a, b)


def test_ragged_rows_past_one_pass_compile_a_graph_per_pass_count_within_the_expected_count(build, monkeypatch):
    """Past one pass the loop runs over torch.split's pieces, so dynamo guards on the number of passes:
    widths with the same count share a graph (a loop over range(0, width, c) specialised every width,
    and ragged long rows reached the recompile limit). The expected count adds a graph per pass count
    for each layer type on that path, so the end-of-run warning stays quiet on such rows."""
    from types import SimpleNamespace

    import torch._dynamo
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    from torch._dynamo.utils import counters

    from align.parallel.compile import block_variants, compile_blocks, expected_compiles, frames_over

    torch._dynamo.reset()
    counters.clear()
    model = build(Family.gemma4_moe).model.train()
    compile_blocks(model, True, backend="eager")
    monkeypatch.setattr(la, "FLASH_MAX_HEAD_DIM", 32)  # the tiny global layers (64) take the chunked path
    monkeypatch.setattr(la, "CHUNK_ROWS", 16)

    def graphs_after(widths):
        for width in widths:
            model(input_ids=torch.randint(3, 400, (2, width)), use_cache=False).logits.sum().backward()
        return int(counters["stats"]["unique_graphs"])

    first = graphs_after((12, 24, 40, 56))  # 1 to 4 passes; 24 is within the tiny window (32)
    assert first > 0  # the blocks compiled, and below: rows past one pass take them without a graph break
    assert graphs_after((36, 44, 47, 50, 58, 61, 63)) == first, "a width with a pass count already seen recompiled"
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    cfg = SimpleNamespace(trainer=SimpleNamespace(compile=True, compile_dynamic=True),
                          data=SimpleNamespace(max_seq_len=64))
    assert la.pass_variants(model.config, 64, "cpu") == 3 * 2  # 3 more pass counts, both layer types off CUDA
    assert la.pass_variants(model.config, 64, "cuda") == 3  # on CUDA the sliding layers stay on flash
    assert la.pass_variants(model.config, 16, "cpu") == 0
    compiled = max(FRAME_COMPILE_COUNTER.values())
    over = frames_over(expected_compiles(cfg, model, None, "cpu"))
    without_passes = frames_over(2 * block_variants(model.config))
    torch._dynamo.reset()
    assert over == [] and without_passes == [compiled], (compiled, over, without_passes)


def test_the_recompile_limit_is_raised_to_the_expected_count_where_lower(build, monkeypatch):
    """Past dynamo's per-frame limit a frame runs eager for good: a configuration expected to compile
    more graphs than the limit allows would lose its compiled blocks by design."""
    from types import SimpleNamespace

    import torch._dynamo.config

    from align.parallel.compile import compile_choice

    model = build(Family.gemma4_moe).model
    monkeypatch.setattr(la, "CHUNK_ROWS", 16)
    cfg = SimpleNamespace(trainer=SimpleNamespace(compile=True, compile_dynamic=True),
                          data=SimpleNamespace(max_seq_len=64))
    # dynamo's own patch: monkeypatch's undo deletes a ConfigModule entry instead of restoring it
    with torch._dynamo.config.patch(recompile_limit=4, accumulated_recompile_limit=256):
        got = compile_choice(cfg, model, None, "cpu")
        assert got == {"expected_compiles_per_frame": 2 * (3 + 3), "recompile_limit": 12}
        assert torch._dynamo.config.recompile_limit == 12
    with torch._dynamo.config.patch(recompile_limit=64):
        assert compile_choice(cfg, model, None, "cpu")["recompile_limit"] == 64  # never lowered
    cfg.trainer.compile = False
    assert compile_choice(cfg, model, None, "cpu") == {"expected_compiles_per_frame": 1, "recompile_limit": None}
