"""`python -m align.train [overrides]`: compose, check, train. Nothing else lives here."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from align.cli import CONF_DIR, die, validate_command_line, wants_hydra_only
from align.config import to_typed
from align.errors import AlignError


def run(cfg: DictConfig) -> int:
    from align.preflight import run_preflight
    from align.trainer import Trainer

    typed = to_typed(cfg)
    run_preflight(typed)
    hc = HydraConfig.get()
    group = Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
    trainer = Trainer.build(typed, Path(hc.runtime.output_dir), OmegaConf.to_container(cfg, resolve=True), group)
    return trainer.fit()


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = run(cfg)
    except AlignError as e:  # Hydra would print a traceback and exit 1; ours are one line and a code
        die(str(e), e.exit_code)
    if code:
        raise SystemExit(code)


def main() -> None:
    if not wants_hydra_only(sys.argv[1:]):
        validate_command_line(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
