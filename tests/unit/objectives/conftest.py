"""Helpers for the objective tests: a preference-objective Trainer built in-process from a tiny config."""

from __future__ import annotations

from pathlib import Path

TINY_DPO = ["objective=dpo", "logger=none", "trainer.device=cpu", "trainer.export=false", "data.max_records=40",
            "data.max_seq_len=160", "data.truncation=drop", "data.on_bad_record=skip", "sampler=shuffle",
            "sampler.micro_batch_size=4"]


def dpo_trainer(root: Path, *overrides: str):
    """A built (not yet fitted) Trainer for objective=dpo on about a dozen short bundled pairs, its encode
    cache (and precomputed reference cache) under `root`."""
    from align.config import to_typed
    from align.run.cli import compose
    from align.trainer import Trainer

    cfg = to_typed(compose([*TINY_DPO, f"data.cache_dir={root / 'cache' / 'encode'}", *overrides]))
    return Trainer.build(cfg, root / "run")


def first_batch(trainer):
    """The micro-batch step 1 would train on, as the run-start gate gets it."""
    return trainer.stream.peek().to(trainer.env.device)


def teacher_checkpoint(d: Path, seed: int = 3, **model) -> Path:
    """A tiny model of another init than the student's (build_tiny(seed=`seed`), `model` its ModelConfig
    fields) saved at `d` with the bundled tokenizer: what `objective.teacher=<d>` loads."""
    from tests.conftest import build_tiny, bundled_tokenizer

    build_tiny(seed=seed, **model).model.save_pretrained(d)
    bundled_tokenizer().save_pretrained(d)
    return d
