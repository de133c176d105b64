"""The mask probe asserts band structure on the masks layers actually receive (docs/triage.md#2), and
fails when the window is widened or dropped, or padding is ignored."""

from __future__ import annotations

import copy
import json

import pytest

from align.config import to_typed
from align.errors import EXIT_CONFIG, ConfigError
from align.probes import mask as mask_probe
from align.run.cli import compose
from tests.conftest import build_tiny, bundled_tokenizer


@pytest.fixture(scope="module")
def gemma():
    from align.data.encode import encode_records
    from align.data.sources import load_records

    cfg = to_typed(compose(["model=gemma4", "attention=sdpa", "data.max_records=16"]))  # transformers' masks
    tok = bundled_tokenizer()
    data = encode_records(load_records(cfg.data), tok, cfg.data)
    model = build_tiny(cfg.model, cfg.attention).model
    return model, data, tok.pad_token_id


def _report(gemma):
    model, data, pad = gemma
    return mask_probe.mask_report(model, mask_probe.probe_batches(data, pad, mask_probe.probe_length(model)))


def test_gemma4_sliding_layers_are_windowed_and_full_layers_causal(gemma):
    r = _report(gemma)
    assert r["ok"] and r["sliding_window"] == 32
    s, f = r["by_type"]["sliding_attention"], r["by_type"]["full_attention"]
    assert s["unpadded"]["max_allowed_per_row"] == 32 and s["padded"]["max_allowed_per_row"] == 32
    assert s["unpadded"]["mask"][0].startswith("Tensor bool")  # the window needs a mask even without padding
    assert f["unpadded"]["mask"] == ["None (is_causal fast path)"]  # no padding, no mask: the fast path
    assert f["padded"]["mask"][0].startswith("Tensor bool")
    assert f["unpadded"]["max_allowed_per_row"] == r["batches"]["unpadded"]["shape"][1] > 32  # the window binds


def _patch_sliding(monkeypatch, fn):
    import transformers.models.gemma4.modeling_gemma4 as g4

    monkeypatch.setattr(g4, "create_sliding_window_causal_mask", fn(g4.create_sliding_window_causal_mask))


def test_widened_window_fails(gemma, monkeypatch):
    def widen(real):
        def wide(**kw):
            c = copy.copy(kw["config"])
            c.sliding_window = kw["config"].sliding_window * 2
            return real(**{**kw, "config": c})
        return wide

    _patch_sliding(monkeypatch, widen)
    r = _report(gemma)
    assert not r["ok"] and not r["by_type"]["sliding_attention"]["unpadded"]["ok"]
    assert r["by_type"]["sliding_attention"]["unpadded"]["max_allowed_per_row"] == 64
    assert r["by_type"]["full_attention"]["unpadded"]["ok"]


def test_a_skipped_sliding_mask_fails_the_run_with_exit_2(gemma, monkeypatch):
    # transformers hands None when a mask function is not registered: windowed layers go full causal
    _patch_sliding(monkeypatch, lambda real: (lambda **kw: None))
    model, data, pad = gemma
    with pytest.raises(ConfigError) as e:
        mask_probe.assert_masks(model, data, pad)
    assert e.value.exit_code == EXIT_CONFIG
    assert "sliding_attention layer" in str(e.value) and "window 32" in str(e.value)


def test_a_full_layer_that_got_a_window_fails(gemma, monkeypatch):
    import transformers.models.gemma4.modeling_gemma4 as g4

    monkeypatch.setattr(g4, "create_causal_mask", g4.create_sliding_window_causal_mask)
    r = _report(gemma)
    assert r["by_type"]["sliding_attention"]["unpadded"]["ok"]
    assert not r["by_type"]["full_attention"]["unpadded"]["ok"] and not r["by_type"]["full_attention"]["padded"]["ok"]
    bad = [lay for lay in r["batches"]["padded"]["layers"] if not lay["ok"]]
    assert bad[0]["type"] == "full_attention" and "misses key" in bad[0]["detail"]


def test_right_padding_without_a_mask_is_still_causal_for_real_rows(gemma, monkeypatch):
    # With right padding a real query never reaches a padding key (they all lie after it), so a full
    # layer handed None on a padded batch computes the same real rows: the probe must not cry wolf.
    import transformers.models.gemma4.modeling_gemma4 as g4

    monkeypatch.setattr(g4, "create_causal_mask", lambda **kw: None)
    r = _report(gemma)
    assert r["ok"] and r["by_type"]["full_attention"]["padded"]["mask"] == ["None (is_causal fast path)"]


def test_mistral_with_a_sliding_window_override_is_windowed_everywhere():
    from align.data.encode import encode_records
    from align.data.sources import load_records

    cfg = to_typed(compose(["+model.overrides.sliding_window=16", "data.max_records=8"]))
    tok = bundled_tokenizer()
    model = build_tiny(cfg.model, cfg.attention).model
    data = encode_records(load_records(cfg.data), tok, cfg.data)
    r = mask_probe.assert_masks(model, data, tok.pad_token_id)
    assert list(r["by_type"]) == ["sliding_attention"]
    assert r["by_type"]["sliding_attention"]["unpadded"]["max_allowed_per_row"] == 16


def test_probe_entry_is_registered_and_writes_its_report(tmp_path):
    from align.tools.probe import PROBES

    assert PROBES["mask"] == "align.probes.mask"
    cfg = to_typed(compose(["probe=mask", "model=gemma4", "probe.mask.records=8"], config_name="probe"))
    assert cfg.probe.name == "mask"
    assert mask_probe.run(cfg, tmp_path) == 0
    report = json.loads((tmp_path / "mask.json").read_text())
    assert report["ok"] and set(report["by_type"]) == {"sliding_attention", "full_attention"}


def test_the_mask_check_leaves_compiled_blocks_caches_empty():
    """The run-start mask check runs eager: traced through compiled blocks, its no-grad forwards and
    its hook's dict filled each block's compile cache up to dynamo's recompile limit, and training
    then ran eager (OLMoE on an H200, 2026-11-30)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from align.data.encode import encode_records
    from align.data.sources import load_records
    from align.parallel.compile import compile_blocks

    cfg = to_typed(compose(["data.max_records=8"]))
    tok = bundled_tokenizer()
    model = build_tiny(cfg.model, cfg.attention).model
    compile_blocks(model, True, backend="eager")
    torch._dynamo.reset()
    counters.clear()
    r = mask_probe.assert_masks(model, encode_records(load_records(cfg.data), tok, cfg.data), tok.pad_token_id)
    assert r["ok"] and counters["stats"]["unique_graphs"] == 0
