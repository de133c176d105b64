"""objective=distill's frozen teacher (`objective.teacher`): the checks preflight runs on it before any
weight is read, its load, its identity and its size for the plan.

Distillation holds the two models' next-token distributions against each other id by id, so a
teacher is refused (one line naming `objective.teacher`, exit 2) unless its tokenizer is the student's
(the same `get_vocab()` and the same special tokens) and its vocabulary size (config.json's
`vocab_size`, the logits' width) is the student's. A teacher of another size is fine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

KEY = "objective.teacher"

SHOWN = 3
"""Differing tokens quoted in a refusal."""


def _specials(tok: Any) -> dict[str, Any]:
    """The special tokens by role, with their ids: what a tokenizer means by bos/eos/pad/...; extra ones too."""
    out = {role: (str(v), tok.convert_tokens_to_ids(str(v))) for role, v in tok.special_tokens_map.items()
           if isinstance(v, str)}
    out["all_special_ids"] = sorted(tok.all_special_ids)
    return out


def tokenizer_problem(student: Any, teacher: Any, where: str) -> Optional[str]:
    """Why the teacher's tokenizer (loaded from `where`) is not the student's, or None."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if a != b:
        differ = sorted({t for t in a.keys() | b.keys() if a.get(t) != b.get(t)}, key=str)
        shown = ", ".join(f"{t!r} (student {a.get(t)}, teacher {b.get(t)})" for t in differ[:SHOWN])
        return (f"the teacher's tokenizer ({where}) is not the student's: {len(differ)} token(s) have another id or "
                f"none ({shown}); distillation compares the two distributions id by id: accepted: a teacher "
                "trained with the student's tokenizer")
    sa, sb = _specials(student), _specials(teacher)
    if sa != sb:
        roles = sorted((sa.keys() | sb.keys()) - {"all_special_ids"}) + ["all_special_ids"]  # a role names it best
        role = next(r for r in roles if sa.get(r) != sb.get(r))
        return (f"the teacher's tokenizer ({where}) has the student's vocabulary but other special tokens: {role} is "
                f"{sb.get(role)} in the teacher's, {sa.get(role)} in the student's: accepted: a teacher with the "
                "student's tokenizer")
    return None


def teacher_problem(cfg: Any) -> tuple[Optional[str], str]:
    """(why `objective.teacher` cannot distill into this run's student, or None; what was checked). Reads
    the teacher's files, both tokenizers and the student's model config: no weight."""
    from transformers import AutoTokenizer

    from align.data.tokenizer import load_tokenizer
    from align.models.build import model_config
    from align.models.checkpoint_files import checkpoint_problem
    from align.models.family import checkpoint_config

    path = cfg.objective.teacher
    if path is None:
        return "objective=distill needs a teacher: objective.teacher=<a local HF checkpoint dir>", ""
    d = Path(path)
    problem = checkpoint_problem(d)
    if problem:
        return problem, ""
    try:
        teacher_tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        return (f"cannot load the teacher's tokenizer from {d} ({type(e).__name__}: {' '.join(str(e).split())}): "
                "the teacher's dir holds its tokenizer, which must be the student's"), ""
    student_tok = load_tokenizer(cfg.model)
    problem = tokenizer_problem(student_tok, teacher_tok, str(d))
    if problem:
        return problem, ""
    vocab = (checkpoint_config(d) or {}).get("vocab_size")
    if vocab is None:
        vocab = (checkpoint_config(d) or {}).get("text_config", {}).get("vocab_size")
    student = model_config(cfg.model, student_tok).vocab_size
    if vocab != student:
        return (f"the teacher's vocabulary size is {vocab} ({d / 'config.json'}), the student's {student}: their "
                "logits must be as wide to be compared: accepted: a teacher whose vocab_size is the student's"), ""
    return None, f"{d}: the student's tokenizer and vocabulary size ({student})"


def teacher_params(path: str) -> int:
    """The teacher's parameter count, from its config alone (the model built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def load_teacher(train_cfg: Any) -> Any:
    """The teacher in the student's parameter dtype, frozen and in eval mode: the composed family's class
    where its config.json is that family's, else AutoModelForCausalLM's; every tensor checked to land
    (align/models/checkpoint_fit.py `load_checked`)."""
    from transformers import AutoModelForCausalLM

    from align.models.checkpoint_fit import load_checked
    from align.models.family import checkpoint_config, family_spec

    path = train_cfg.objective.teacher
    spec = family_spec(train_cfg.model)
    model_cls = spec.classes()[1] if spec.fits(checkpoint_config(path) or {}) else AutoModelForCausalLM
    model, _ = load_checked(model_cls, path, KEY, local_files_only=True, dtype=train_cfg.model.dtype or "float32")
    model.requires_grad_(False)
    model.eval()
    return model


def teacher_identity(model: Any, path: str) -> dict[str, Any]:
    """What the manifest and the checkpoint name the teacher by: its dir, the sha256 of its weight files
    (align/core/hashing.py `sha256_files`) and of the weights as loaded (align/objectives/reference.py
    `weights_sha256`, as a reference's), its class and parameter count."""
    from align.core.hashing import sha256_files
    from align.objectives.reference import weights_sha256

    d = Path(path)
    files = sorted(p for p in d.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name.startswith(
        "pytorch_model") or p.name == "model.safetensors.index.json"))
    return {"path": str(d.resolve()), "files_sha256": sha256_files(files, d) if files else None,
            "weights_sha256": weights_sha256(model), "class": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()), "dtype": str(next(model.parameters()).dtype)}
