"""Coordinated stop and non-finite handling on 2 gloo ranks, with hang timeouts that fail the test.

Stop: a REAL signal to ONE rank's PID (SIGTERM to rank 1, then SIGUSR2 to rank 0, then SIGINT to
rank 1, each in a job that resumed from the previous stop) makes both ranks finish the same optimizer
step, write one stop checkpoint together and exit 143.

Non-finite: NaN injected into one rank's loss (ALIGN_TEST_INJECT_NAN) skips that optimizer step on
both ranks; more than trainer.max_consecutive_skipped_steps in a row halt both with the same message,
HALT.json and exit 81 - with the injection on rank 0 and on rank 1. Parameters that went non-finite
(a NaN put into ONE rank's shard after a step, where no loss sees it before the write) are never
checkpointed or exported: both ranks halt with 81 instead.

Start-up: a SIGTERM before the first step ends the CLI run at once with 143, its manifest completed
and its exit recorded.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.integration.distributed import TINY, fit_many, history, result, run, start, wait

STOP_CFG = TINY + ["parallel=fsdp", "trainer.max_steps=100000", "trainer.save_every=0", "trainer.keep_last=0"]
SIGNALS = [(signal.SIGTERM, 1), (signal.SIGUSR2, 0), (signal.SIGINT, 1)]


def _stop_checkpoints(run_dir: Path) -> list[int]:
    from align.control.ckpt_index import complete

    return [s for s, _ in complete(run_dir / "checkpoints")]


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"HANG: waited {timeout:.0f}s for {what}")
        time.sleep(0.2)


def test_a_signal_to_any_one_rank_stops_both_at_the_same_boundary(tmp_path):
    run_dir = tmp_path / "run"
    jobs = [{"run_dir": str(run_dir), "overrides": STOP_CFG} for _ in SIGNALS]
    procs = start(fit_many, 2, jobs, str(tmp_path / "codes.json"))
    try:
        seen = 0  # last step logged before the current job
        for sig, rank in SIGNALS:
            # the job is in its loop (handlers installed) once it logs a step past the last stop
            _wait_for(lambda seen=seen: (run_dir / "history.jsonl").is_file() and history(run_dir)
                      and history(run_dir)[-1]["step"] >= seen + 2, 240, f"job to train past step {seen + 2}")
            before = len(_stop_checkpoints(run_dir))
            os.kill(procs[rank].pid, sig)
            _wait_for(lambda before=before: len(_stop_checkpoints(run_dir)) > before, 120,
                      f"the stop checkpoint after {sig.name}")
            seen = _stop_checkpoints(run_dir)[-1]
    finally:
        codes = wait(procs, 120, "ranks after the last stop")
    assert codes == [0, 0]
    assert json.loads((tmp_path / "codes.json").read_text()) == [143, 143, 143]
    stops = _stop_checkpoints(run_dir)
    assert len(stops) == 3 and stops == sorted(stops)
    rows = history(run_dir)
    # one row per step: each job resumed exactly where the previous stopped, and the history ends
    # at the last stop checkpoint (no rank trained a step the other did not)
    assert [r["step"] for r in rows] == list(range(1, stops[-1] + 1))
    for s in stops:
        meta = json.loads((run_dir / "checkpoints" / f"step_{s:08d}" / "meta.json").read_text())
        assert meta["reason"] == "stop" and meta["state"]["step"] == s
        ranks = [json.loads((run_dir / "checkpoints" / f"step_{s:08d}" / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0]["stream"]["index"] == ranks[1]["stream"]["index"]
    for r in (0, 1):
        assert result(run_dir, r)["code"] == 143


NAN_CFG = TINY + ["parallel=fsdp", "trainer.max_steps=6", "trainer.max_consecutive_skipped_steps=2"]


def poison_after(trainer, rank: int, step: int, on_rank: int) -> None:
    """After `step` is applied, a NaN in ONE rank's shard of the embedding (what an applied step with a
    huge learning rate does to every parameter); the run writes before any loss can see it."""
    from torch.distributed.tensor import DTensor

    inner = trainer.train_step

    def train_step(batches):
        out = inner(batches)
        if rank == on_rank and trainer.state.step == step:
            p = trainer.model.get_input_embeddings().weight
            with torch.no_grad():
                (p.to_local() if isinstance(p, DTensor) else p).view(-1)[-1] = float("nan")
        return out

    trainer.train_step = train_step


@pytest.fixture(scope="module")
def nan_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    cases = {"halt_rank0": "0:2-", "halt_rank1": "1:2-", "transient_rank1": "1:3"}
    jobs = [{"run_dir": str(root / k), "overrides": NAN_CFG, "env": {"ALIGN_TEST_INJECT_NAN": v}}
            for k, v in cases.items()]
    jobs += [{"run_dir": str(root / "params_export"), "overrides": NAN_CFG + ["trainer.export=true"],
              "hook": functools.partial(poison_after, step=6, on_rank=1)},
             {"run_dir": str(root / "params_checkpoint"), "overrides": NAN_CFG + ["trainer.save_every=2"],
              "hook": functools.partial(poison_after, step=2, on_rank=0)}]
    assert run(fit_many, 2, jobs, str(root / "codes.json"), timeout=300) == [0, 0]
    return root, json.loads((root / "codes.json").read_text())


@pytest.mark.parametrize("case", ["halt_rank0", "halt_rank1"])
def test_nan_on_one_rank_halts_every_rank_with_the_same_message(nan_runs, case):
    root, codes = nan_runs
    d = root / case
    outcomes = [result(d, r) for r in (0, 1)]
    assert [o["code"] for o in outcomes] == [81, 81]
    assert outcomes[0]["error"] == outcomes[1]["error"]
    assert ("3 consecutive non-finite optimizer steps exceed trainer.max_consecutive_skipped_steps=2"
            in outcomes[0]["error"])
    halt = json.loads((d / "HALT.json").read_text())
    assert halt["code"] == 81 and halt["message"] == outcomes[0]["error"] and halt["step"] == 4
    assert halt["skip_stats"] == {"consecutive": 3, "total": 3, "last_cause": halt["skip_stats"]["last_cause"]}
    assert "non-finite loss on 1 rank(s)" in halt["skip_stats"]["last_cause"]
    rows = history(d)
    assert [r["skipped"] for r in rows] == [False, True, True, True]
    assert not (d / "checkpoints").exists()  # a verdict, not a stop: nothing to resume


def test_one_transient_nan_skips_exactly_one_step_and_the_run_finishes(nan_runs):
    root, codes = nan_runs
    d = root / "transient_rank1"
    assert codes[2] == 0 and [result(d, r)["code"] for r in (0, 1)] == [0, 0]
    rows = history(d)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["skipped"] for r in rows] == [False, False, True, False, False, False]
    assert rows[2]["loss"] == "nan" and rows[2]["skipped_steps"] == 1
    assert not math.isfinite(float(rows[2]["grad_norm"]))  # rank 1's NaN reached every shard's gradient
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for i, r in enumerate(rows) if i != 2)
    assert rows[-1]["loss"] < rows[0]["loss"] and not (d / "HALT.json").exists()


@pytest.mark.parametrize("case,step,refused", [("params_export", 6, "nothing was exported"),
                                               ("params_checkpoint", 2, "the cadence checkpoint was not written")])
def test_nonfinite_parameters_on_one_rank_are_never_written_and_halt_every_rank(nan_runs, case, step, refused):
    root, codes = nan_runs
    d = root / case
    outcomes = [result(d, r) for r in (0, 1)]
    assert [o["code"] for o in outcomes] == [81, 81] and outcomes[0]["error"] == outcomes[1]["error"]
    error = outcomes[0]["error"]
    assert error.startswith("1 of ") and f"after step {step} (model.embed_tokens.weight)" in error and refused in error
    halt = json.loads((d / "HALT.json").read_text())
    assert halt["code"] == 81 and halt["step"] == step and halt["nonfinite_parameters"] == ["model.embed_tokens.weight"]
    assert [r["step"] for r in history(d)] == list(range(1, step + 1)) and not any(r["skipped"] for r in history(d))
    assert not (d / "export").exists() and not (d / "checkpoints").exists()


# A SIGTERM that lands while the data loads: start-up, before the first step (deterministic, unlike a
# timed kill); the rest is the real `python -m align.train`.
SIGNAL_DURING_START_UP = (
    "import os, runpy, signal, sys\n"
    "import align.objectives.sft as t\n"
    "load = t.load_dataset\n"
    "def signalled(*a, **kw):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return load(*a, **kw)\n"
    "t.load_dataset = signalled\n"
    "sys.argv = ['align.train'] + sys.argv[1:]\n"
    "runpy.run_module('align.train', run_name='__main__')\n"
)


def test_a_sigterm_during_start_up_ends_at_once_with_the_manifest_completed_and_the_exit_recorded(tmp_path):
    d = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", SIGNAL_DURING_START_UP, f"hydra.run.dir={d}", "allow_dirty=true",
                        "logger=none", "data.max_records=16", "trainer.max_steps=2"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 143, p.stderr[-3000:]
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("align: error:")] == [
        "align: error: stop requested (SIGTERM) during start-up, before the first optimizer step: nothing to save; "
        "the run resumes from where it was"]
    m = json.loads((d / "provenance.json").read_text())
    assert m["status"] == "complete" and m["run"]["exit_code"] == 143 and "SIGTERM" in m["run"]["exit_reason"]
    assert json.loads((d / "rank0" / "exit.json").read_text())["code"] == 143
    assert not (d / "history.jsonl").exists() and not (d / "checkpoints").exists()
