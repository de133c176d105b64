"""A trained reward model as a reward (`reward=model reward.path=<export dir>`): an export of
objective=reward_model, or any local checkpoint of a `...ForSequenceClassification` class with
num_labels=1, weighted as `model` in `reward.weights` beside the verifiers and your functions
(docs/rewards.md).

It scores as TRL's GRPOTrainer scores with a reward model (trl/trainer/grpo_trainer.py: a
`reward_processing_class` per reward model): each prompt's messages and the completion as the assistant's
turn, rendered through the REWARD MODEL's tokenizer's chat template (not the policy's), tokenized without
special tokens, padded on the right, and the reward is `logits[:, 0]`: the head's scalar at each row's last
token that is not pad_token_id, transformers' own pooling. A tokenizer without a pad token pads with its
eos token and the model's config is given that pad id, as TRL does.

`ModelReward` is the loaded model and its tokenizer: `score` runs it under no_grad in batches of
`reward.model_batch_size`. Preflight's check of `reward.path` (its files, config.json and tokenizer; no
weight read) and the load (once, on the training device: bf16 on CUDA, fp32 on a CPU; frozen, eval mode)
are align/objectives/scoring_model.py's, which reads the models layer. No torch at import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

MODEL = "model"
"""The name `reward.weights` weighs the reward model by (`reward.path`), and its part in the step's row
(`reward/model`)."""


def weight_files(d: Path) -> list[Path]:
    """The checkpoint's weight files, as objective=distill's teacher is hashed (align/objectives/teacher.py)."""
    return sorted(p for p in d.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name.startswith(
        "pytorch_model") or p.name == "model.safetensors.index.json"))


def load_tokenizer(path: str | Path) -> Any:
    """The reward model's own tokenizer, with a pad token (its eos where it has none, as TRL sets it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def render(tok: Any, messages: Sequence[dict[str, str]], completion: str) -> str:
    """The text the reward model reads: the prompt's messages and the completion as the assistant's turn,
    through its chat template (TRL's `apply_chat_template({"messages": prompt + completion})`)."""
    return tok.apply_chat_template([*messages, {"role": "assistant", "content": completion}], tokenize=False)


def file_identity(path: str) -> dict[str, Any]:
    """What the manifest names the reward model by, from its files: its dir, its class, the sha256 of its weight
    files (align/core/hashing.py `sha256_files`), its tokenizer's and chat template's sha256."""
    import json

    from align.core.hashing import sha256_files, tokenizer_hashes

    d = Path(path).expanduser().resolve()
    files = weight_files(d)
    tok_sha, template_sha, _ = tokenizer_hashes(d)
    return {"path": str(d), "class": (json.loads((d / "config.json").read_text()).get("architectures") or [None])[0],
            "weights_sha256": sha256_files(files, d) if files else None, "weight_files": [p.name for p in files],
            "tokenizer_sha256": tok_sha, "chat_template_sha256": template_sha}


class ModelReward:
    """The reward model, loaded: `score(messages, completions)` gives one float per completion."""

    def __init__(self, model: Any, tokenizer: Any, path: str, batch_size: int) -> None:
        self.model, self.tokenizer, self.path, self.batch_size = model, tokenizer, path, batch_size
        self.device = next(model.parameters()).device
        self.identity_files = file_identity(path)

    def texts(self, messages: Sequence[Sequence[dict[str, str]]], completions: Sequence[str]) -> list[str]:
        return [render(self.tokenizer, m, c) for m, c in zip(messages, completions)]

    def score(self, messages: Sequence[Sequence[dict[str, str]]], completions: Sequence[str]) -> list[float]:
        """Completion i's reward, read with prompt messages[i], in batches of `batch_size`."""
        import torch

        texts = self.texts(messages, completions)
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(text=texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                                     padding_side="right", add_special_tokens=False).to(self.device)
                out.extend(self.model(**enc).logits[:, 0].float().tolist())
        return out

    def identity(self) -> dict[str, Any]:
        return {**self.identity_files, "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
                "device": str(self.device), "batch_size": self.batch_size,
                "reads": "the prompt's messages and the completion through the reward model's own chat template; "
                         "logits[:, 0] at each row's last token that is not pad_token_id"}
