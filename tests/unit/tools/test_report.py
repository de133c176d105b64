"""`python -m align.tools.report DIR`: one row per job of a multirun dir, from overrides and history."""

from __future__ import annotations

import json

from align.tools import report


def _job(root, n, overrides, rows):
    d = root / str(n)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(step, loss, tokens, real, t, zero, roots):
    return {"step": step, "loss": loss, "tokens": tokens, "real_tokens": real, "step_time_s": t,
            "pad_waste": 1 - real / tokens, "zero_pad_frac": zero, "roots_in_window": roots}


def test_report_reads_every_job(tmp_path, capsys):
    _job(tmp_path, 0, ["sampler=bucket", "sampler.bucket_size=2"],
         [_row(1, 5.0, 100, 50, 9.0, 0, 3), _row(2, 4.0, 100, 60, 1.0, 0.5, 2)])
    _job(tmp_path, 1, ["sampler=bucket", "sampler.bucket_size=32"],
         [_row(1, 5.0, 100, 90, 1.0, 1, 4), _row(2, 3.5, 100, 100, 0.5, 1, 4)])
    (tmp_path / "10").mkdir()  # a job that died before writing anything: still a row
    (tmp_path / "10" / ".hydra").mkdir()
    assert report.main([str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "report.json").read_text())
    assert [r["job"] for r in rows] == ["0", "1", "10"]
    a, b, dead = rows
    assert a["real_tokens_per_s"] == 60.0  # step 1 is left out of the rate
    assert a["pad_waste"] == 1 - 110 / 200 and a["zero_pad_frac"] == 0.25 and a["roots_per_window"] == 2.5
    assert a["final_loss"] == 4.0 and b["final_loss"] == 3.5 and b["pad_waste"] == 1 - 190 / 200
    assert dead["status"] == "no history"
    out = capsys.readouterr().out
    assert "shared overrides: sampler=bucket" in out and "sampler.bucket_size=32" in out
    assert (tmp_path / "report.png").stat().st_size > 5_000


def test_report_on_a_dir_without_jobs_exits_2(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "no job dirs" in capsys.readouterr().err


def test_dot_axes_zoom_onto_close_values_and_start_at_zero_for_spread_ones():
    lo, hi = report.axis_limits([3.4895, 3.5085, 3.5245])  # final losses of a sweep: bars from 0 all look alike
    assert 3.4 < lo < 3.4895 and 3.5245 < hi < 3.6
    assert report.axis_limits([5.0, 18.0, 41.0])[0] == 0.0  # padding waste 5..41 %: the ratio reads off the axis
    lo, hi = report.axis_limits([2.0, 2.0])
    assert lo < 2.0 < hi


def test_the_report_figure_has_a_title_readable_labels_and_loss_curves(tmp_path):
    _job(tmp_path, 0, ["sampler=bucket", "sampler.bucket_size=2"],
         [_row(s, 4.0 - 0.01 * s, 100, 50, 1.0, 0, 3) for s in (1, 2, 3)])
    _job(tmp_path, 1, ["sampler=bucket", "sampler.bucket_size=32"],
         [_row(s, 4.0 - 0.02 * s, 100, 90, 1.0, 1, 4) for s in (1, 2, 3)])
    jobs = report.job_dirs(tmp_path)
    fig = report.figure([report.job_row(j) for j in jobs], "align.tools.report sweep",
                        {j.name: report.loss_points(j) for j in jobs})
    assert fig._suptitle.get_text().startswith("align.tools.report sweep: 2 of 2 jobs")
    assert "shared: sampler=bucket" in fig._suptitle.get_text()
    tokens, waste, loss, curves = fig.axes
    assert [t.get_text() for t in tokens.get_yticklabels()] == ["sampler.bucket_size=2", "sampler.bucket_size=32"]
    assert min(t.get_fontsize() for t in tokens.get_yticklabels()) >= 9
    assert loss.get_xlim()[0] > 3.9  # final losses 3.97 and 3.94: not an axis from 0
    assert [ln.get_label() for ln in curves.get_lines()] == ["sampler.bucket_size=2", "sampler.bucket_size=32"]
    assert curves.get_xlabel() == "optimizer step" and "loss" in curves.get_ylabel()


def test_a_torn_last_history_line_is_skipped_and_said_a_torn_middle_line_refused(tmp_path, capsys):
    rows = [_row(s, 4.0 - 0.1 * s, 100, 50, 1.0, 0, 3) for s in (1, 2, 3)]
    _job(tmp_path, 0, ["sampler=bucket"], rows)
    hist = tmp_path / "0" / "history.jsonl"
    whole = hist.read_text()
    hist.write_text(whole + json.dumps(_row(4, 3.0, 100, 50, 1.0, 0, 3))[:17])  # a kill during the append of step 4
    assert report.main([str(tmp_path)]) == 0
    [row] = json.loads((tmp_path / "report.json").read_text())
    assert row["steps"] == 3 and row["final_loss"] == 4.0 - 0.3 and row["torn_last_line"] == f"{hist}:4"
    assert f"note: {hist}:4: torn last line skipped" in capsys.readouterr().out

    lines = whole.splitlines(keepends=True)
    hist.write_text(lines[0] + lines[1][:17] + "\n" + lines[2])  # the same tear, but rows follow it: corruption
    (tmp_path / "report.json").unlink()
    assert report.main([str(tmp_path)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"align: error: {hist}:2: not a JSON row"), err
    assert not (tmp_path / "report.json").exists()
