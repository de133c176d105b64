"""`python -m align.tools.probe probe=<name> [train overrides]`: triage probes on the composed run.

Each probe reuses the trainer's own data pipeline, model build, collate and loss, so it measures
what actually runs. A probe module exposes `run(cfg: TrainConfig, out_dir: Path) -> int`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from align.config import to_typed
from align.errors import AlignError, ConfigError
from align.run.cli import CONF_DIR, checked_run_dirs, die, validate_command_line, wants_hydra_only

# probe name -> module with run(cfg, out_dir). Only implemented probes are listed.
PROBES: dict[str, str] = {
    "scaling": "align.probes.scaling",
    "kernels": "align.probes.kernels",
    "mask": "align.probes.mask",
    "padding": "align.probes.padding",
}
BUILDS_TRAINER = {"scaling", "kernels"}
"""The probes that build the trainer as `python -m align.train` does: the same preflight runs on their config
first (the others read the data alone, or build the bare model)."""


def run(cfg: DictConfig) -> int:
    typed = to_typed(cfg)
    name = typed.probe.name
    if name not in PROBES:
        raise ConfigError("probe", f"no probe named {name!r}; available: {', '.join(sorted(PROBES)) or 'none'}")
    module = importlib.import_module(PROBES[name])
    plan = {}
    if name in BUILDS_TRAINER:  # the build takes the plan its preflight made: one plan per probe job
        from align.run.preflight_checks import run_preflight

        plan = {"plan": run_preflight(typed).plan}
    return module.run(typed, Path(HydraConfig.get().runtime.output_dir), **plan)


@hydra.main(config_path=str(CONF_DIR), config_name="probe", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = run(cfg)
    except AlignError as e:
        die(str(e), e.exit_code)
    if code:
        raise SystemExit(code)


def main() -> None:
    if not wants_hydra_only(sys.argv[1:]):
        validate_command_line(sys.argv[1:], config_name="probe")
        checked_run_dirs(sys.argv[1:], "probe", resumes=False)  # a probe never writes over another run
    _hydra_main()


if __name__ == "__main__":
    main()
