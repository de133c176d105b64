"""Resume policy and refusals, the dataset fingerprint, history trimming; non-finite bookkeeping;
stop signals; the boundary verdict."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from align.config import ResumePolicy, TrainConfig
from align.control import nonfinite
from align.control.boundary import agree
from align.control.resume import check_resumable, mismatches, resume_points, trim_history
from align.control.signals import StopSignals
from align.errors import ConfigError
from align.parallel.env import DistEnv
from tests.unit.control.test_checkpoint import _fake

ENV = DistEnv(rank=0, world=1, local_rank=0, device=torch.device("cpu"))
IDENTITY = {"world_size": 2, "parallel": {"kind": "fsdp", "ep_size": None}, "dataset_fingerprint": "sha256:aa",
            "sampler": {"kind": "shuffle", "micro_batch_size": 8, "seed": 0},
            "model_shape": {"class": "M", "params": 10, "sha256": "bb"}}


def _cfg(**trainer) -> TrainConfig:
    cfg = TrainConfig()
    for k, v in trainer.items():
        setattr(cfg.trainer, k, v)
    return cfg


def test_auto_resume_tries_the_complete_checkpoints_newest_first(tmp_path):
    root = tmp_path / "checkpoints"
    _fake(root, 2)
    _fake(root, 4)
    _fake(root, 6, skip="meta.json")  # incomplete: ignored
    assert resume_points(_cfg(), tmp_path) == [root / "step_00000004", root / "step_00000002"]
    assert resume_points(_cfg(resume=ResumePolicy.never), tmp_path) == []
    assert resume_points(_cfg(resume_from=str(root / "step_00000002")), tmp_path) == [root / "step_00000002"]


def test_resume_policies_that_cannot_be_met_are_refused_with_the_key(tmp_path):
    with pytest.raises(ConfigError, match="trainer.resume: must resume"):
        resume_points(_cfg(resume=ResumePolicy.must), tmp_path)
    _fake(tmp_path / "checkpoints", 6, skip="optim/.metadata")
    with pytest.raises(ConfigError, match="trainer.resume_from: not a complete checkpoint.*optim/.metadata"):
        resume_points(_cfg(resume_from=str(tmp_path / "checkpoints" / "step_00000006")), tmp_path)


@pytest.mark.parametrize("key,value", [("world_size", 1), ("dataset_fingerprint", "sha256:cc"),
                                       ("model_shape", {"class": "M", "params": 12, "sha256": "dd"}),
                                       ("sampler", {"kind": "bucket", "micro_batch_size": 8, "seed": 0})])
def test_a_checkpoint_of_a_different_run_is_refused_with_the_reason_unless_forced(key, value):
    now = {**IDENTITY, key: value}
    with pytest.raises(ConfigError) as err:
        check_resumable("ckpt", {"identity": IDENTITY}, now, force=False)
    msg = str(err.value)
    assert msg.startswith("trainer.resume: refusing to resume from ckpt:") and f"{key} was" in msg
    assert "trainer.resume_despite_mismatch=true" in msg
    assert check_resumable("ckpt", {"identity": IDENTITY}, now, force=True) == mismatches(IDENTITY, now) != []
    assert check_resumable("ckpt", {"identity": IDENTITY}, dict(IDENTITY), force=False) == []


def test_trim_history_moves_rows_past_the_checkpoint_aside(tmp_path):
    h = tmp_path / "history.jsonl"
    h.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 8)))
    assert trim_history(h, 5) == 2
    assert [json.loads(x)["step"] for x in h.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert [json.loads(x)["step"] for x in (tmp_path / "history.superseded.jsonl").read_text().splitlines()] == [6, 7]
    assert trim_history(h, 5) == 0


def test_the_injection_hook_reads_rank_and_steps(monkeypatch):
    monkeypatch.setenv(nonfinite.INJECT_ENV, "1:3")
    assert [nonfinite.injected_nan(1, s) for s in (2, 3, 4)] == [False, True, False]
    assert not nonfinite.injected_nan(0, 3)
    monkeypatch.setenv(nonfinite.INJECT_ENV, "0:2-")
    assert [nonfinite.injected_nan(0, s) for s in (1, 2, 50)] == [False, True, True]
    monkeypatch.setenv(nonfinite.INJECT_ENV, "0:2-3")
    assert [nonfinite.injected_nan(0, s) for s in (2, 3, 4)] == [True, True, False]
    monkeypatch.delenv(nonfinite.INJECT_ENV)
    assert not nonfinite.injected_nan(0, 2)


def test_skip_stats_count_runs_and_halt_only_past_the_limit(tmp_path):
    s = nonfinite.SkipStats()
    for cause in ("a", None, "b", "c"):
        s.record(cause)
    assert (s.consecutive, s.total, s.last_cause) == (2, 3, "c")
    assert not s.over(2) and s.over(1)
    msg = nonfinite.halt_message(s, 1)
    assert msg == ("2 consecutive non-finite optimizer steps exceed trainer.max_consecutive_skipped_steps=1 "
                   "(last cause: c)")
    halt = json.loads(nonfinite.write_halt(tmp_path, msg, 7, s).read_text())
    assert halt["code"] == 81 and halt["step"] == 7 and halt["skip_stats"]["total"] == 3


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR2])
def test_a_stop_signal_only_sets_the_flag_and_the_handler_outlives_the_loop(sig):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    try:
        with StopSignals() as stop:
            assert not stop.requested
            os.kill(os.getpid(), sig)
            assert stop.requested and stop.reason == signal.Signals(sig).name
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher reaping survivors: still only a flag
        assert stop.reason == signal.Signals(sig).name
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_without_a_stop_the_handlers_are_restored():
    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)]
    with StopSignals():
        pass
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)] == before


def test_a_second_sigint_means_now():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    try:
        with pytest.raises(KeyboardInterrupt):
            with StopSignals():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_the_boundary_verdict_skips_on_nonfinite_loss_or_norm_and_carries_stop():
    v = agree(ENV, False, 2.5, 1.0, 10, 8)
    assert (v.stop, v.skip_cause, v.loss, v.tokens, v.real_tokens) == (False, None, 2.5, 10, 8)
    v = agree(ENV, True, float("nan"), 1.0, 10, 8)
    assert v.stop and v.skip_cause == "non-finite loss on 1 rank(s)"
    v = agree(ENV, False, 1.0, float("inf"), 10, 8)
    assert v.skip_cause == "non-finite gradient norm (inf)"


def test_during_start_up_a_stop_signal_ends_the_run_at_once_and_one_before_it_on_entry():
    from align.errors import EXIT_SIGNAL, StopRequested

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    try:
        with StopSignals() as stop:
            with pytest.raises(StopRequested, match="SIGTERM.*start-up") as err:
                with stop.at_once():
                    os.kill(os.getpid(), signal.SIGTERM)
            assert err.value.exit_code == EXIT_SIGNAL
            os.kill(os.getpid(), signal.SIGUSR2)  # after the block: a flag again, the unwinding goes on
        with StopSignals() as early:
            os.kill(os.getpid(), signal.SIGUSR2)  # before start-up began (preflight): raises on entry
            with pytest.raises(StopRequested, match="SIGUSR2"):
                with early.at_once():
                    pass
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_nested_entries_install_once_and_restore_on_the_outermost_exit():
    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)]
    with StopSignals() as stop:  # the job's
        with stop:  # fit()'s
            pass
        assert signal.getsignal(signal.SIGTERM) == stop._handle  # still ours between fit() and the manifest
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)] == before


def test_nonfinite_parameters_names_every_tensor_with_nan_or_inf():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    assert nonfinite.nonfinite_parameters(m, ENV) == []
    with torch.no_grad():
        m[0].bias[1] = float("inf")
        m[1].weight[0, 0] = float("nan")
    assert nonfinite.nonfinite_parameters(m, ENV) == ["0.bias", "1.weight"]
    msg = nonfinite.parameters_message(["0.bias", "1.weight"], 4, 3, "nothing was exported")
    assert msg.startswith("2 of 4 parameter tensors hold nan/inf after step 3 (0.bias, 1.weight): nothing was exported")


def test_a_torn_last_history_line_is_dropped_so_the_next_append_starts_a_row(tmp_path):
    from align.telemetry.history import History, read_history

    h = tmp_path / "history.jsonl"
    h.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')  # killed mid-append
    assert trim_history(h, 3) == 0
    history = History(h)
    history.append({"step": 4})
    history.close()
    assert [r["step"] for r in read_history(h)] == [1, 2, 3, 4]
    assert not (tmp_path / "history.superseded.jsonl").exists()

    h.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')  # not the last line: corruption, refused
    with pytest.raises(ConfigError, match=f"{h}:2: not a JSON row"):
        trim_history(h, 1)
