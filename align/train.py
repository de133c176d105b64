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
    from align.trainer import Trainer

    typed = to_typed(cfg)
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
    argv = sys.argv[1:]
    if not wants_hydra_only(argv):
        # Every job of the command line is composed, typed and preflighted before Hydra creates a
        # run dir: a refusal leaves nothing behind.
        from align.preflight import run_preflight

        for typed in validate_command_line(argv):
            try:
                run_preflight(typed)
            except AlignError as e:
                die(str(e), e.exit_code)
    _hydra_main()


if __name__ == "__main__":
    main()
