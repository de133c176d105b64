"""Prompt data for RL (objective=grpo): each record becomes a prompt, rendered through the chat
template up to the assistant's turn, and the reference answer its completions are scored against.

A record is read as for SFT (align/data/sources.py, in any chat format of align/data/formats.py but
`text`, which has no prompt); its last assistant turn is the reference, and everything before it is the
prompt.
So `data=gsm8k_prompts` gives GSM8K questions with their answer fields, `data=add` the bundled
addition task, and `data=jsonl_prompts` a local file of {"prompt", "reference"} lines.

Refused before any model is built, one line naming file:line and exit 2: a reference that one of the
reward's verifiers cannot read (`WeightedReward.check_reference`), and (data.truncation=fail) a prompt
longer than `data.max_seq_len - objective.max_new_tokens`; with drop such prompts are dropped and counted.
Under python rewards (`reward.function`, `reward.functions`) each prompt also keeps its record's fields, the
keywords the functions are called with (a field named like one of the call's own arguments is refused), and the
fingerprint covers them.

The prompts are an `EncodedDataset` (prompt tokens, no loss tokens), so the resumable stream, the
sampler's fingerprint and the manifest's data records work as for SFT; the dataset's fingerprint also
covers the references (a changed answer is a different data set to a resume).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from align.config import DataConfig, TrainConfig, Truncation
from align.data.encode import EncodedDataset
from align.data.samplers import ShuffleSampler
from align.data.sources import Record, content_sha256, load_records, source_specs
from align.errors import ConfigError
from align.rewards import BadReference, WeightedReward
from align.rewards.function import OWN_ARGUMENTS, Group

log = logging.getLogger("align")

PROMPTS_VERSION = 1
"""Bump when what a prompt row holds changes for the same inputs (rendering, reference rule)."""


@dataclass
class PromptSet:
    data: EncodedDataset
    """Row i: the tokens of prompt i (no loss tokens)."""
    references: list[str]
    """Row i: the reference answer the reward scores prompt i's completions against."""
    texts: list[str]
    """Row i: the prompt rendered through the chat template (what a python reward gets as `prompts`)."""
    wheres: list[str]
    """Row i: `<file>:<line>` of its record, what a reward failure names."""
    columns: list[dict[str, Any]]
    """Row i: its record's fields under a python reward; empty dicts otherwise."""
    messages: list[list[dict[str, str]]] = field(default_factory=list)
    """Row i: the prompt's messages (what a reward model renders through its own chat template)."""

    def __len__(self) -> int:
        return len(self.references)

    def prompt(self, i: int) -> list[int]:
        return self.data.row(i)[0].tolist()

    def group(self, i: int, completions: list[str], completion_ids: list[list[int]]) -> Group:
        """Prompt i with its completions, as the reward scores them."""
        return Group(prompt=self.texts[i], reference=self.references[i], columns=self.columns[i], where=self.wheres[i],
                     completions=completions, completion_ids=completion_ids, messages=self.messages[i])


def split_record(record: Record) -> tuple[list[dict[str, str]], str]:
    """(prompt messages, reference): the reference is the last assistant turn, the prompt what precedes it."""
    last = max(i for i, m in enumerate(record.messages) if m["role"] == "assistant")
    return record.messages[:last], record.messages[last]["content"]


def _where(cfg: DataConfig, record: Record) -> str:
    spec = source_specs(cfg)[record.source]
    line = record.id.rpartition(":")[2]
    return f"{spec.path}:{line}" if spec.id_field is None else f"{spec.path} (record {record.id})"


def _fingerprint(tokens: list[np.ndarray], ids: list[str], roots: list[str], refs: list[str],
                 columns: list[dict[str, Any]]) -> str:
    h = hashlib.sha256(f"prompts/{PROMPTS_VERSION}".encode())
    for t, i, r, ref, c in zip(tokens, ids, roots, refs, columns):
        h.update(np.ascontiguousarray(t, dtype=np.int32).tobytes() + b"\0" + f"{i}\0{r}\0{ref}\0".encode())
        if c:  # only under a python reward, which reads them: other runs keep their fingerprint
            h.update(json.dumps(c, sort_keys=True, default=str).encode() + b"\0")
    return h.hexdigest()


_LOADED: dict[tuple, PromptSet] = {}
"""The last prompt set read, by `_loaded_key`: the memory plan reads the prompts before the objective
does (align/plan/budget_auto.py `plan_sizes`), and one read serves both."""


def _loaded_key(cfg: TrainConfig, tokenizer: Any, reward: WeightedReward) -> tuple:
    files = tuple((str(s.path), content_sha256(s.path)) for s in source_specs(cfg.data) if s.path.exists())
    functions = tuple((n, f.spec) for n, f in reward.functions.items())  # python rewards keep the records' fields
    return (repr(cfg.data), cfg.objective.max_new_tokens, tokenizer.name_or_path, len(tokenizer),
            tokenizer.chat_template, tokenizer.eos_token_id, repr(sorted(reward.weights.items())), functions, files)


def _check_fields(record: Record, functions: Any, where: str) -> None:
    """The record's fields fit the python rewards' calls: none collides with the call's own arguments, and
    each field a function requires is there."""
    clash = sorted(set(record.columns or {}) & set(OWN_ARGUMENTS))
    if clash:
        raise ConfigError(where, f"field {clash[0]!r} would collide with the reward function's own argument of "
                          f"that name ({', '.join(OWN_ARGUMENTS)}): rename the field")
    for function in functions:
        missing = [f for f in function.fields if f not in (record.columns or {})]
        if missing:
            raise ConfigError(where, f"{function.key} {function.spec} requires the field {missing[0]!r}, which this "
                              f"record lacks (its fields: {', '.join(sorted(record.columns or {}))})")


class NoReward:
    """The reward of an objective that scores nothing (objective=distill): no verifier reads the references,
    no function the records' fields."""

    weights: dict[str, float] = {}
    functions: dict[str, Any] = {}

    def check_reference(self, reference: str) -> None:
        return None


def run_reward(cfg: TrainConfig) -> WeightedReward | NoReward:
    """The reward the run's objective reads its prompts with: the reward group's, or none where it weighs nothing."""
    if not cfg.reward.weights:
        return NoReward()
    return WeightedReward.of(cfg.reward)


def load_prompts(cfg: TrainConfig, tokenizer: Any, reward: WeightedReward) -> PromptSet:
    """The prompts and references of `cfg.data`, encoded and checked (the module docstring's refusals)."""
    if tokenizer.chat_template is None:
        raise ConfigError("model.pretrained", "the tokenizer has no chat template: prompts are rendered through it")
    key = _loaded_key(cfg, tokenizer, reward)
    if key not in _LOADED:
        prompts = _load_prompts(cfg, tokenizer, reward)
        _LOADED.clear()
        _LOADED[key] = prompts
    return _LOADED[key]


def longest_prompt(cfg: TrainConfig) -> tuple[int, int]:
    """(tokens of the longest prompt the run keeps, prompts kept), read as the objective will read them
    (`load_prompts` with the run's tokenizer and reward): what the memory plan sizes a rollout by."""
    from align.data.tokenizer import load_tokenizer

    prompts = load_prompts(cfg, load_tokenizer(cfg.model), run_reward(cfg))
    return int(prompts.data.lengths.max()), len(prompts)


def _load_prompts(cfg: TrainConfig, tokenizer: Any, reward: WeightedReward) -> PromptSet:
    data_cfg = cfg.data
    limit = data_cfg.max_seq_len - cfg.objective.max_new_tokens
    report: dict[str, Any] = {}
    keep = bool(reward.functions)  # a python reward is called with the record's fields
    records = load_records(data_cfg, report, columns=keep)
    formats = report.pop("formats")
    tokens, ids, roots, refs, sources, dropped, texts, wheres, columns = [], [], [], [], [], [], [], [], []
    kept_messages: list[list[dict[str, str]]] = []
    for r in records:
        if r.text is not None:
            raise ConfigError(_where(data_cfg, r), "a text record has no prompt and no reference answer; accepted for "
                              "RL prompts: a chat format (messages, sharegpt, alpaca, prompt_completion)")
        messages, ref = split_record(r)
        if keep:
            _check_fields(r, reward.functions.values(), _where(data_cfg, r))
        try:
            reward.check_reference(ref)
        except BadReference as e:
            raise ConfigError(_where(data_cfg, r), f"{e} (reward.weights {sorted(reward.weights)} cannot score "
                              "against it)") from None
        if not messages:
            raise ConfigError(_where(data_cfg, r), "record has no prompt before its reference answer")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids_ = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids_) > limit:
            if data_cfg.truncation == Truncation.fail:
                raise ConfigError(_where(data_cfg, r), f"prompt has {len(ids_)} tokens, more than data.max_seq_len - "
                                  f"objective.max_new_tokens = {limit} (data.truncation=fail; accepted: drop, or a "
                                  "larger data.max_seq_len)")
            dropped.append(r.id)
            continue
        tokens.append(np.asarray(ids_, dtype=np.int32))
        texts.append(text)
        kept_messages.append(messages)
        wheres.append(_where(data_cfg, r))
        columns.append(r.columns or {})
        ids.append(r.id)
        roots.append(r.root)
        refs.append(ref)
        sources.append(r.source)
    if not ids:
        raise ConfigError("data.max_seq_len", f"no prompt is left: all {len(dropped)} are longer than {limit} tokens")
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    flat = np.concatenate(tokens)
    stats = {"records_in": len(records), "records_kept": len(ids), "dropped_too_long": len(dropped),
             "dropped_ids": dropped[:100], "prompt_token_limit": limit, "tokens": int(lengths.sum()),
             "truncation_policy": data_cfg.truncation.value, **report}
    specs = source_specs(data_cfg)
    meta = {"fingerprint": _fingerprint(tokens, ids, roots, refs, columns), "prompts_version": PROMPTS_VERSION,
            "formats": formats,
            "references": "the last assistant turn of each record (data.response_field for prompt/response records)",
            "sources": [{"name": s.name, "kind": s.kind.value, "path": str(s.path), "sha256": content_sha256(s.path)}
                        for s in specs]}
    data = EncodedDataset(tokens=flat, loss_mask=np.zeros(len(flat), dtype=bool),
                          offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), ids=ids, roots=roots,
                          stats=stats, source_index=np.asarray(sources, dtype=np.int32), meta=meta)
    if dropped:
        log.warning("prompts: dropped %d longer than %d tokens, first: %s", len(dropped), limit, dropped[0])
    log.info("prompts: %d, %d tokens, references checked by %s", len(ids), int(lengths.sum()), sorted(reward.weights))
    return PromptSet(data=data, references=refs, texts=texts, wheres=wheres, columns=columns, messages=kept_messages)


class WholeBatchSampler(ShuffleSampler):
    """Rollout batches of prompts: a seeded shuffle per epoch cut into `micro_batch_size` prompts; the
    epoch's short tail is left out, so every rollout of every rank holds the same number of prompts."""

    kind = "prompts"
    size_key = "objective.prompts_per_rollout"

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        return [b for b in super().global_batches(epoch) if len(b) == self.micro_batch_size]


def build_prompt_stream(cfg: TrainConfig, prompts: PromptSet, pad_id: int, rank: int = 0, world: int = 1):
    """The resumable stream of prompt batches (one per rollout, `objective.prompts_per_rollout` each)."""
    from align.data.loader import BatchStream
    from align.data.stats import DataStats, plan_stats, root_codes

    size = cfg.objective.prompts_per_rollout
    if len(prompts) < size * world:
        raise ConfigError("objective.prompts_per_rollout", f"the data holds {len(prompts)} prompts, fewer than "
                          f"prompts_per_rollout x ranks = {size} x {world}", size)
    weights = [s.weight for s in source_specs(cfg.data)]
    sampler = WholeBatchSampler(prompts.data.lengths, size, cfg.trainer.seed, rank, world,
                                mixture=(prompts.data.source_index, weights))
    sampler.plan = plan_stats(sampler, root_codes(prompts.data.roots), world)
    return BatchStream(prompts.data, sampler, pad_id, stats=DataStats(prompts.data, sampler.plan))
