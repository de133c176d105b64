"""A run's recorded `.hydra/config.yaml` replays the run, with the documented command exactly as
written (docs/provenance.md, "Replay"): same resolved config, same losses, exit 0, a new run dir."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from tests.conftest import REPO, run_cli


def test_the_recorded_config_replays_the_run_into_a_new_run_dir(tmp_path):
    env = {"PYTHONPATH": str(REPO)}  # the replay runs from another directory, as a user's would
    first = run_cli("align.train", f"hydra.run.dir={tmp_path / 'run'}", "allow_dirty=true", "logger=none",
                    "trainer.max_steps=2", "data.max_records=24", "optimizer.lr=3e-4", "trainer.export=false",
                    cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml")
    # `tokens_field` holds the word TOKEN, not a credential: it is recorded as it is
    assert recorded.data.tokens_field == "input_ids" and recorded.optimizer.lr == 3e-4

    replay = run_cli("align.train", "--config-path", "run/.hydra", "--config-name", "config", cwd=tmp_path, env=env)
    assert replay.returncode == 0, replay.stderr[-3000:]
    (again,) = list((tmp_path / "outputs").iterdir())  # conf/hydra's run dir, not the recorded one
    a, b = (json.loads((d / "provenance.json").read_text()) for d in (tmp_path / "run", again))
    assert a["config"]["resolved"] == b["config"]["resolved"] and a["config"]["hash"] == b["config"]["hash"]
    assert a["config"]["resolved"]["data"]["tokens_field"] == "input_ids" and not a["redacted"]
    assert b["run"]["exit_code"] == 0 and b["run"]["hydra_overrides"] == []
    losses = [[json.loads(ln)["loss"] for ln in (d / "history.jsonl").read_text().splitlines()]
              for d in (tmp_path / "run", again)]
    assert losses[0] == losses[1] and len(losses[0]) == 2
