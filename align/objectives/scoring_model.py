"""The reward model GRPO scores with (`reward=model reward.path=<dir>`; the scorer is
align/rewards/model_reward.py): preflight's check of `reward.path` from its files, before the run dir and
before any weight is read, and its load on the training device.

Refused in one line naming `reward.path` (exit 2): a path that is not there or not a loadable checkpoint
dir, a config.json whose architectures name no `...ForSequenceClassification` class (a causal LM has no
reward head) or whose num_labels is not 1, a tokenizer that does not load, has no pad or eos token, or
whose chat template cannot render a prompt and its completion.

The plan counts it beside the policy (align/objectives/grpo_terms.py `scoring_model`): its weights in the
dtype it is loaded in, from its config alone (`meta_scoring_model`), and one forward's activations."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Optional

from align.rewards.model_reward import ModelReward, load_tokenizer, render

KEY = "reward.path"
PROBE = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
"""The conversation preflight renders through the reward model's chat template (a prompt and its completion,
as every completion is scored)."""
SUFFIX = "ForSequenceClassification"


def _said(e: BaseException) -> str:
    """An exception as one short line: its type and its message's first sentence."""
    first = re.split(r"(?<=[.!?])\s", " ".join(str(e).split()), maxsplit=1)[0]
    return f"{type(e).__name__}: {first[:200]}"


def model_problem(path: str) -> tuple[Optional[str], str]:
    """(why `reward.path` cannot score completions, or None; what was checked), from its files alone: the
    dir, its weights' files (align/models/checkpoint_files.py), config.json's class and num_labels, its
    tokenizer and chat template. transformers is imported only once the files are seen to be there."""
    from align.models.checkpoint_files import checkpoint_problem

    accepted = "accepted: the export dir of an objective=reward_model run (<run>/export)"
    d = Path(path).expanduser()
    if not d.exists():
        return f"no such directory: {d} ({accepted})", ""
    problem = checkpoint_problem(d)
    if problem:
        return f"{problem} ({accepted})", ""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(d), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        return f"cannot read {d / 'config.json'} ({_said(e)})", ""
    arch = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith(SUFFIX) for a in arch):
        return (f"{d / 'config.json'} names architectures {arch}, not a sequence classifier: a reward model is a "
                f"...{SUFFIX} class with num_labels=1 ({accepted}; a causal LM has no reward head)"), ""
    if config.num_labels != 1:
        return (f"{d / 'config.json'} has num_labels={config.num_labels}: a reward model gives one scalar per text, "
                f"num_labels=1 ({accepted})"), ""
    try:
        tok = load_tokenizer(d)
    except (OSError, ValueError, TypeError) as e:
        return f"cannot load the reward model's tokenizer from {d} ({_said(e)})", ""
    if tok.pad_token_id is None:
        return (f"the reward model's tokenizer ({d}) has neither a pad nor an eos token: its batches cannot be "
                "padded"), ""
    try:
        render(tok, PROBE[:1], PROBE[1]["content"])
    except Exception as e:  # jinja's errors, or transformers' ValueError for a tokenizer without a template
        return (f"the reward model's tokenizer ({d}) cannot render a prompt and its completion through its chat "
                f"template ({_said(e)}): accepted: a tokenizer with a "
                "chat template"), ""
    return None, f"{d}: {next(a for a in arch if a.endswith(SUFFIX))}, num_labels=1, its tokenizer's chat template"


def scoring_dtype(device_type: str) -> str:
    """The dtype the reward model is loaded in on a device of `device_type` (the load and the plan read it)."""
    return "bfloat16" if device_type == "cuda" else "float32"


def meta_scoring_model(path: str) -> Any:
    """The reward model of `path` on the meta device (shapes only, no weight read), built from its config.json
    with the class the load uses: what the plan counts its weights and forward from."""
    from align.errors import ConfigError

    d = Path(path).expanduser().resolve()
    try:
        return _meta_scoring_model(str(d), (d / "config.json").stat().st_mtime_ns)
    except (OSError, ValueError, KeyError) as e:  # preflight's check of reward.path says why in full
        raise ConfigError(KEY, f"cannot build the reward model from {d / 'config.json'} to count it in the memory "
                               f"estimate ({_said(e)})") from None


@functools.lru_cache(maxsize=4)
def _meta_scoring_model(path: str, mtime_ns: int) -> Any:  # the plan asks once per candidate: built once per file
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


def load_model_reward(path: str, device: Any, batch_size: int) -> ModelReward:
    """The reward model on `device`, once: bf16 on CUDA, fp32 elsewhere (`scoring_dtype`); frozen, eval mode,
    every tensor checked to land (align/models/checkpoint_fit.py `load_checked`)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from align.models.checkpoint_fit import load_checked

    device = torch.device(device)
    dtype = getattr(torch, scoring_dtype(device.type))
    tok = load_tokenizer(path)
    model, _ = load_checked(AutoModelForSequenceClassification, path, KEY, local_files_only=True, dtype=dtype)
    # transformers pools at each row's last token that is not pad_token_id: the tokenizer's pad (TRL's rule).
    model.config.get_text_config().pad_token_id = tok.pad_token_id
    model.requires_grad_(False)
    model.eval()
    return ModelReward(model.to(device), tok, path, batch_size)
