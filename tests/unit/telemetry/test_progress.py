"""The progress bar stays quiet when stderr is not a TTY: a log line every log_every steps only."""

from __future__ import annotations

from align.telemetry.progress import Progress


def test_progress_is_quiet_when_not_a_tty(capsys):
    p = Progress(total=20, initial=0, enabled=True, log_every=10)
    assert not p.tty  # pytest captures stderr: not a TTY
    for step in range(1, 21):
        p.update(step, loss=1.0, tokens_per_s=100.0)
    p.close()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert [ln.split()[1] for ln in lines] == ["10/20", "20/20"], err


def test_progress_is_silent_off_rank_0(capsys):
    p = Progress(total=5, initial=0, enabled=False, log_every=1)
    for step in range(1, 6):
        p.update(step, loss=1.0, tokens_per_s=1.0)
    p.close()
    assert capsys.readouterr().err == ""
