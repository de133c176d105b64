"""The teacher a distillation arm reads (align's `objective.teacher`, the TRL GKD arm's `--teacher`): the
student's own model (the arm's experiment: its family, shape, dtype and tokenizer) at another init, the
trainer's seed + 1, so the two distributions differ. bench/run.py writes it once per command under
$OUT/teacher, before any arm runs, with align's export code (align/models/export.py: safetensors, config
and the tokenizer beside them), which is the checkpoint layout objective.teacher loads."""

from __future__ import annotations

from pathlib import Path

TEACHER_DIR = "teacher"
SEED_OFFSET = 1
"""The teacher's init seed is the student's trainer.seed plus this."""


def teacher_key(typed) -> tuple:
    """What the teacher is built from: two distillation arms of one command must agree on it."""
    return typed.model, typed.trainer.seed


def write_teacher(out: Path, typed) -> str:
    """Build the teacher of `typed` (a distillation arm's config) and write it to out/teacher; its line
    for the command's output."""
    import torch

    from align.data.tokenizer import load_tokenizer
    from align.models import build_model
    from align.models.export import export_hf

    cuda = typed.trainer.device.value != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    tokenizer = load_tokenizer(typed.model)
    torch.manual_seed(typed.trainer.seed + SEED_OFFSET)
    model = build_model(typed.model, typed.attention, tokenizer, device, init_on_device=cuda).model
    export_hf(model, tokenizer, out / TEACHER_DIR)
    params = sum(p.numel() for p in model.parameters())
    dtype = next(model.parameters()).dtype
    del model
    if cuda:
        torch.cuda.empty_cache()
    return (f"teacher: the student's model at seed {typed.trainer.seed + SEED_OFFSET}, {params / 1e6:,.1f} M "
            f"parameters in {dtype}, at {out / TEACHER_DIR}")
