"""bench/attention_layers.py on the CPU: the default experiment's tiny preset, two widths (one past
the sliding window, one within it), the compiled candidates on dynamo's eager backend. Every
candidate that runs matches the fp32 reference, a refusal is a row with its error, the shapes are
attention=layered's plan, and --only filters without touching the candidate table."""

from __future__ import annotations

import json
import math

import pytest

from bench import attention_layers as bench

ONLY = ("sdpa_mask", "sdpa_causal", "chunked", "layered", "windowed")
WIDTHS = (48, 16)  # the tiny preset's window is 32


def test_tiny_run_gives_every_candidate_a_finite_error_against_the_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "BACKEND", bench.BACKEND)  # main sets it: restored for what runs next
    out = tmp_path / "attention.json"
    rc = bench.main(["--tiny", "--tokens", "96", "--widths", ",".join(map(str, WIDTHS)), "--warmup", "1",
                     "--reps", "1", "--only", ",".join(ONLY), "--backend", "eager", "--out", str(out)])
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["device"] == "cpu" and got["backend"] == "eager"
    # Gemma-4 MoE's tiny preset, as attention=layered's plan reads it: the global layers' own head dim
    # and key/value heads
    assert got["shapes"] == {
        "sliding_attention": {"heads": 4, "kv_heads": 2, "head_dim": 32, "window": 32, "layers": 3},
        "full_attention": {"heads": 4, "kv_heads": 1, "head_dim": 64, "window": None, "layers": 1},
    }
    rows = {(r["layer_type"], r["candidate"], r["width"]): r for r in got["rows"]}
    want = {(kind, name, w) for kind, per in bench.CANDIDATES.items() for name in per if name in ONLY
            for w in WIDTHS}
    assert len(got["rows"]) == len(want) and set(rows) == want
    assert ("full_attention", "chunked", 48) in want and ("sliding_attention", "layered", 48) in want
    refused = ("sliding_attention", "sdpa_causal", 48)  # is_causal would drop the window past it
    assert "window" in rows[refused]["error"] and "max_abs_err" not in rows[refused]
    for key, r in rows.items():
        assert r["rows"] == 96 // r["width"] and r | got["shapes"][r["layer_type"]] == r
        if key == refused:
            continue
        assert "error" not in r, (key, r.get("error"))
        assert math.isfinite(r["max_abs_err"]) and r["max_abs_err"] < 2e-2, (key, r["max_abs_err"])
        assert r["fwd_bwd_ms"] > 0
    assert {"flex", "sdpa_cudnn", "sdpa_efficient"} <= set(bench.CANDIDATES["full_attention"])


def test_an_unknown_candidate_exits_2_naming_the_candidates(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--tiny", "--only", "layred", "--out", str(tmp_path / "a.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no candidate layred" in err and "layered" in err
    assert not (tmp_path / "a.json").exists()
