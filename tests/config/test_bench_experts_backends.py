"""bench/experts_backends.py on the CPU: the default Gemma-4 arm's tiny preset, every backend's row
beside the eager loop's (its reference), each row served by the kernel it names, and a bad backend
refused in one line."""

from __future__ import annotations

import json

from bench import experts_backends as bench


def test_every_backend_runs_through_its_own_kernel_and_matches_the_eager_loop(tmp_path, monkeypatch):
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    calls: dict[str, int] = {}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return wrapper

    for name in ("grouped_mm", "batched_mm"):
        monkeypatch.setitem(ALL_EXPERTS_FUNCTIONS._global_mapping, name, counted(name, ALL_EXPERTS_FUNCTIONS[name]))
    out = tmp_path / "experts.json"
    assert bench.main(["--tiny", "--tokens", "48,80", "--warmup", "1", "--reps", "2", "--no-compile",
                       "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["shape"] == {"experts": 8, "top_k": 2, "hidden": 128, "expert_width": 64}
    assert [(r["backend"], r["tokens"]) for r in got["rows"]] == [
        (b, t) for t in (48, 80) for b in ("eager", "grouped_mm", "batched_mm")]
    assert calls == {"grouped_mm": 1 + 2 + 1 + 2, "batched_mm": 6}  # warm-up and timed passes, each count
    for r in got["rows"]:
        assert r["ms_median"] > 0 and "error" not in r
        if r["backend"] != "eager":
            assert r["max_rel_err_vs_eager"] < 1e-5, r


def test_an_unknown_backend_is_refused_in_one_line(capsys):
    assert bench.main(["--tiny", "--backends", "grouped_mm,cutlass"]) == 2
    err = capsys.readouterr().err
    assert "--backends grouped_mm,cutlass" in err and "grouped_mm,batched_mm,eager" in err
