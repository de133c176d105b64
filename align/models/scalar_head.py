"""The scalar head of a reward model (an objective whose schema sets `scalar_head`, e.g. objective=reward_model).

The model is the class transformers' `AutoModelForSequenceClassification` builds for the family's
model_type with num_labels=1 (mistral: MistralForSequenceClassification; under model=hf the checkpoint's
model_type), so the export loads with `AutoModelForSequenceClassification.from_pretrained` and no align
code. A family transformers maps to no such class (olmoe, the Gemma-4 text families) is refused in
preflight, one line naming it.

The build is the causal LM's, unchanged (preset or checkpoint, every load check): `to_scalar_head` then
moves its backbone under the head class, built on the meta device from the same config (num_labels=1,
pad_token_id the tokenizer's, architectures naming the class), and gives it a fresh `score` initialised
as transformers initialises a Linear. The LM head is dropped.

transformers reads a sequence's reward at its last token that is not pad_token_id, in each row. A packed
row holds several documents, so the objective reads the per-token scores (`token_scores`: the head's
output, captured through the model's own forward) at `reward_positions`, the same rule applied within
each document.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import numpy as np
import torch

from align.config import Family
from align.models.family_table import FAMILIES, FamilySpec


def head_class_name(spec: FamilySpec) -> Optional[str]:
    """The class `AutoModelForSequenceClassification` maps the family's model_type to; None: none."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(spec.model_type)


def head_refusal(spec: FamilySpec, option: str, lora: bool = False) -> Optional[tuple[str, str]]:
    """(key, why in one line) `option` (`objective=<kind>`) cannot train a scalar head here; None when it can.
    LoRA is refused: the new `score` is no adapter target, so it would stay at its random init (and an adapter
    export would lack it)."""
    if lora and head_class_name(spec) is not None:
        return "model.lora.enabled", (f"{option} trains a new score head, which LoRA would leave at its "
                                      "random init: accepted: model.lora.enabled=false (a full fine-tune)")
    if head_class_name(spec) is not None:
        return None
    name = spec.name.value if spec.name != Family.hf else f"hf (model_type {spec.model_type!r})"
    fits = [f"model={f.value}" for f, s in FAMILIES.items() if head_class_name(s) is not None]
    return "model", (f"{option} needs a sequence-classification class and transformers' "
            f"AutoModelForSequenceClassification maps model={name} (model_type {spec.model_type!r}) to none; "
            f"accepted: {', '.join(fits)}, or model=hf with a checkpoint whose model_type it maps (llama, qwen2, ...)")


def to_scalar_head(lm: torch.nn.Module, spec: FamilySpec, pad_token_id: int) -> torch.nn.Module:
    """The reward model: `lm`'s backbone under the family's sequence-classification class (module doc)."""
    from align.core.signatures import resolve

    name = head_class_name(spec)
    cls = resolve(f"transformers:{name}")
    config = lm.config  # one config object for the backbone's modules and the head, as from_pretrained gives
    config.num_labels = 1
    config.get_text_config().pad_token_id = pad_token_id
    config.architectures = [name]
    backbone = getattr(lm, lm.base_model_prefix)
    with torch.device("meta"):
        model = cls(config)
    setattr(model, model.base_model_prefix, backbone)
    weight = next(backbone.parameters())
    model.score = torch.nn.Linear(config.get_text_config().hidden_size, 1, bias=False, device=weight.device,
                                  dtype=weight.dtype)
    torch.nn.init.normal_(model.score.weight, mean=0.0, std=config.get_text_config().initializer_range)
    return model


def head_record(model: torch.nn.Module) -> dict[str, Any]:
    """The manifest's account of the head (`objective.head`), read back from the built model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text = base.config.get_text_config()
    return {"class": type(base).__name__, "num_labels": base.config.num_labels, "pad_token_id": text.pad_token_id,
            "score_shape": list(base.score.weight.shape),
            "reward_read_at": "each sequence's last token that is not pad_token_id (transformers' rule), per "
                              "document in a packed row"}


@contextlib.contextmanager
def token_scores(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """While open, every forward of `model` appends its head's per-token scores [B, L] (with grad)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    got: list[torch.Tensor] = []
    handle = base.score.register_forward_hook(lambda m, a, out: got.append(out[..., 0]))
    try:
        yield got
    finally:
        handle.remove()


def reward_positions(data: Any, rows: np.ndarray, width: int, packed: bool, pad_id: int) -> np.ndarray:
    """Flat indices into a micro-batch's [B * L] scores of each sequence's reward token, in row order:
    its last token that is not `pad_id` (transformers' rule; a sequence of pads only: its first token),
    within its row when padded, within its document when packed (documents back to back from 0)."""
    out = np.empty(len(rows), dtype=np.int64)
    start = 0
    for i, r in enumerate(rows):
        tokens = data.row(int(r))[0]
        real = np.flatnonzero(tokens != pad_id)
        last = int(real[-1]) if len(real) else 0
        if packed:
            out[i] = start + last
            start += len(tokens)
        else:
            out[i] = i * width + last
    return out
