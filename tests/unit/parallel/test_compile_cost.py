"""What compiling costs and where it keeps its work (align/parallel/compile.py): the inductor cache
persists where the docs say, a frame that compiles past its expected count is found, and the cost of
compiling is visible."""

from __future__ import annotations

from align.parallel.compile import apply_cache_dir, expected_compiles_per_frame, frames_over


def test_the_inductor_cache_goes_to_a_persistent_default_unless_the_environment_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ALIGN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    rec = apply_cache_dir()
    assert rec == {"dir": str(tmp_path / "xdg" / "align" / "inductor"), "source": "$XDG_CACHE_HOME/align/inductor"}
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == rec["dir"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert apply_cache_dir() == {"dir": str(tmp_path / "mine"),
                                 "source": "$TORCHINDUCTOR_CACHE_DIR from the environment"}


def test_a_frame_that_compiles_more_graphs_than_expected_is_found():
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    assert expected_compiles_per_frame(True, True, None) == 2
    assert expected_compiles_per_frame(True, None, None) == 3
    assert expected_compiles_per_frame(True, True, None, variants=3) == 6  # Gemma-4: docs/performance.md
    assert expected_compiles_per_frame(True, False, None) is None
    assert expected_compiles_per_frame(False, None, 16) == 16

    def f(x):
        return x * 2

    g = torch.compile(f, backend="eager", dynamic=False)
    for n in (2, 3, 4):  # static shapes: a graph per shape
        g(torch.ones(n))
    assert frames_over(2) == [3]
    assert frames_over(3) == [] and frames_over(None) == []
    torch._dynamo.reset()


def test_the_first_step_and_the_compile_share_are_on_the_progress_line(caplog, monkeypatch):
    import logging

    import align.telemetry.progress as progress

    clock = iter([10.0, 11.5, 11.5])  # 10 s compiled before this run (an earlier job of the process)
    monkeypatch.setattr(progress, "compile_seconds", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="align"):
        p = progress.Progress(4, 0, True, 1)
        p.tty = False
        p.update({"step": 1, "loss": 2.0, "tokens_per_s": 100.0, "step_time_s": 3.25})
    err = "\n".join(r.getMessage() for r in caplog.records)
    assert "first step 3.2s (compiling 1.5s so far)" in err and "of the wall" in err


def test_the_compile_cost_counts_from_this_runs_start(monkeypatch):
    """dynamo's compile timer is per process: a sweep's second job (or a test after others) must not
    report the earlier jobs' compiles as its own (a GPU test read 238% of the wall)."""
    import align.telemetry.throughput as tp

    clock = iter([40.0, 42.0])
    monkeypatch.setattr(tp, "compile_seconds", lambda: next(clock))
    t = tp.Throughput.__new__(tp.Throughput)
    t._compile0, t._steps, t._first_s, t._all_s = tp.compile_seconds(), 2, 3.0, 8.0
    cost = t.compile_cost()
    assert cost["throughput/compile_s"] == 2.0 and cost["throughput/compile_share"] == 0.25
