"""The progress bar stays quiet when stderr is not a TTY: a log line every log_every steps only, through
the `align` logger (hence in train.log as well); under a bar the lines go to the log files only."""

from __future__ import annotations

import io
import logging
import sys

from align.telemetry.progress import Phase, Progress


def lines_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "align"]


def test_progress_is_quiet_when_not_a_tty(caplog):
    with caplog.at_level(logging.INFO, logger="align"):
        p = Progress(total=20, initial=0, enabled=True, log_every=10)
        assert not p.tty  # pytest captures stderr: not a TTY
        for step in range(1, 21):
            p.update({"step": step, "loss": 1.0, "tokens_per_s": 100.0})
        p.close()
    assert [ln.split()[1] for ln in lines_of(caplog)] == ["10/20", "20/20"], lines_of(caplog)


def test_progress_is_silent_off_rank_0(caplog, capsys):
    with caplog.at_level(logging.INFO, logger="align"):
        p = Progress(total=5, initial=0, enabled=False, log_every=1)
        for step in range(1, 6):
            p.update({"step": step, "loss": 1.0, "tokens_per_s": 1.0})
        p.close()
    assert lines_of(caplog) == [] and capsys.readouterr().err == ""


def test_the_line_names_the_objectives_metrics_and_leaves_out_those_a_step_lacks(caplog):
    metrics = (("reward", "reward/mean"), ("kl", "kl/ref_mean"), ("logp mismatch", "mismatch/logp_abs_mean"))
    with caplog.at_level(logging.INFO, logger="align"):
        p = Progress(total=2, initial=0, enabled=True, log_every=1, metrics=metrics)
        p.update({"step": 1, "loss": 0.0, "reward/mean": 0.25, "mismatch/logp_abs_mean": 0.5, "tokens_per_s": 9.0})
        p.update({"step": 2, "loss": 0.0, "kl/ref_mean": 0.125, "tokens_per_s": 9.0})
        p.close()
    steps = [ln for ln in lines_of(caplog) if ln.startswith("step ")]
    assert steps[0].startswith("step 1/2 reward 0.2500 logp mismatch 0.5000 tok/s 9"), steps
    assert steps[1].startswith("step 2/2 kl 0.1250 tok/s 9"), steps
    assert "loss" not in " ".join(steps)  # GRPO's surrogate is not what a person watches


def test_under_a_bar_the_lines_reach_the_log_file_and_not_the_console(tmp_path, monkeypatch):
    """A TTY gets the bar; train.log (a FileHandler, as Hydra's job logging opens it) still gets each line."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    console, file = io.StringIO(), logging.FileHandler(tmp_path / "train.log")
    stream = logging.StreamHandler(console)
    log = logging.getLogger("align")
    old = log.level
    log.setLevel(logging.INFO)
    log.addHandler(file)
    log.addHandler(stream)
    try:
        p = Progress(total=2, initial=0, enabled=True, log_every=1)
        assert p.tty
        for step in (1, 2):
            p.update({"step": step, "loss": 2.0, "tokens_per_s": 5.0})
        p.close()
        with Phase("reference log-probs", 3) as phase:
            phase.advance(3)
    finally:
        log.removeHandler(file)
        log.removeHandler(stream)
        log.setLevel(old)
        file.close()
    text = (tmp_path / "train.log").read_text()
    assert "step 1/2 loss 2.0000" in text and "step 2/2 loss 2.0000" in text, text
    assert "reference log-probs: 3 done" in text, text
    assert console.getvalue() == ""  # the bar is the console's


def test_a_phase_off_a_tty_says_start_and_end(caplog):
    with caplog.at_level(logging.INFO, logger="align"):
        with Phase("rollout 0", 8, every_s=0.0) as phase:
            phase.advance(4)
            phase.advance(4)
    got = lines_of(caplog)
    assert got[0] == "rollout 0: started (8 to do)" and got[1].startswith("rollout 0: 4/8 in ")
    assert got[-1].startswith("rollout 0: 8 done in "), got


def test_a_quiet_phase_says_nothing_unless_it_lasts(caplog):
    """A rollout recurs every GRPO step: only one that lasts `every_s` gets a line."""
    with caplog.at_level(logging.INFO, logger="align"):
        with Phase("rollout 0", quiet=True, every_s=3600.0):
            pass
        assert lines_of(caplog) == []
        with Phase("rollout 1", quiet=True, every_s=0.0):
            pass
    (line,) = lines_of(caplog)
    assert line.startswith("rollout 1: done in ")
