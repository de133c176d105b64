"""`python -m align.tools.probe`: a probe that builds the trainer (scaling, kernels) gets align.train's
preflight at the door, before the probe's own module runs; a probe that reads the data alone does not."""

from __future__ import annotations

import pytest

from align.errors import ConfigError
from align.tools.probe import BUILDS_TRAINER, PROBES, run


@pytest.mark.parametrize("probe", sorted(BUILDS_TRAINER))
def test_a_probe_that_builds_the_trainer_is_refused_by_preflight_before_it_runs(compose, tmp_path, probe):
    missing = tmp_path / "missing.jsonl"
    cfg = compose([f"probe={probe}", "data=jsonl", f"data.path={missing}", "allow_dirty=true"], config_name="probe")
    # Refused with preflight's one line for the key; the probe itself never ran (it would ask Hydra for its
    # run dir, which no Hydra job set).
    with pytest.raises(ConfigError, match=rf"^data\.path: .*{missing.name}"):
        run(cfg)


def test_every_probe_that_builds_the_trainer_is_a_probe():
    assert BUILDS_TRAINER <= set(PROBES)
