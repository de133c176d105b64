"""A run's loss curve: `<run_dir>/plots/loss.png` from history.jsonl at the end of every run (rank 0),
logged to W&B as an image when W&B is on."""

from __future__ import annotations

import json

from align.config import to_typed
from align.telemetry.plots import LOSS_PNG, loss_curve, write_loss_plot

PNG = b"\x89PNG\r\n\x1a\n"


def flat(row: dict, prefix: str = "") -> dict:
    """A W&B history row with nested values as slash keys: the log holds an image either way."""
    out = {}
    for k, v in row.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_curve_skips_non_finite_steps_and_says_so(tmp_path):
    rows = [{"step": 1, "loss": 5.0, "lr": 1e-4}, {"step": 2, "loss": "nan", "lr": 1e-4},
            {"step": 3, "loss": 4.0, "lr": 5e-5}]
    path = loss_curve(rows, tmp_path / "plots" / "loss.png", "training loss: r")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000
    assert loss_curve([{"step": 1, "loss": "nan"}], tmp_path / "none.png", "t") is None
    assert not (tmp_path / "none.png").exists()  # nothing to draw: no empty picture
    assert write_loss_plot(tmp_path / "no-run", "t") is None


def test_a_run_writes_its_loss_png_and_logs_it_to_wandb(compose, tmp_path, monkeypatch):
    from align.trainer import Trainer
    from tests.wandb_log import read_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = to_typed(compose(["logger=wandb", "logger.mode=offline", "data.max_records=16", "trainer.max_steps=2",
                            "trainer.export=false"]))
    run_dir = tmp_path / "run"
    assert Trainer.build(cfg, run_dir).fit() == 0
    assert (run_dir / LOSS_PNG).read_bytes()[:8] == PNG
    (wb,) = list((run_dir / "wandb").glob("offline-run-*"))
    logged = [flat(h) for h in read_run(wb)["history"]]
    logged = [h for h in logged if "plots/loss/_type" in h]
    assert len(logged) == 1 and logged[0]["plots/loss/_type"] == "image-file"
    assert (wb / "files" / logged[0]["plots/loss/path"]).read_bytes()[:8] == PNG


def test_a_run_without_wandb_still_writes_it(compose, tmp_path):
    from align.trainer import Trainer

    cfg = to_typed(compose(["logger=none", "data.max_records=16", "trainer.max_steps=2", "trainer.export=false"]))
    assert Trainer.build(cfg, tmp_path / "run").fit() == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and (tmp_path / "run" / LOSS_PNG).stat().st_size > 10_000


def test_the_plot_title_takes_a_token_shaped_run_name_redacted(tmp_path, monkeypatch):
    import align.telemetry.plots as plots
    from align.core.redaction import REDACTED
    from align.telemetry.wandb_logger import Logger

    titles: list[str] = []
    monkeypatch.setattr(plots, "write_loss_plot", lambda run_dir, title, *_: titles.append(title))
    plots.plot_run(tmp_path, "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cD1eF3g", Logger())
    assert titles == [f"training: {REDACTED}"]
