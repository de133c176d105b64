"""What each objective trains on for one item of its data, as `python -m align.tools.inspect` prints it
(`Objective.view`, align/objectives/interface.py): the sequences exactly as the run encodes them, with their
loss masks, and the lines that say how they enter the loss. Each objective's class names its own view
here, so a new objective brings its own and the tool never branches on the kind."""

from __future__ import annotations

from typing import Any

from align.objectives.interface import View


def check_index(index: int, n: int, holds: str) -> None:
    """IndexError past the end; `holds` says what the data has, e.g. "the encoded data set has {n} records"."""
    if index >= n:
        raise IndexError(f"index={index}: {holds.format(n=n)}; accepted: 0..{n - 1}")


def _source(cfg: Any, data: Any, row: int) -> str:
    from align.data.sources import source_specs

    spec = source_specs(cfg.data)[int(data.source_index[row])]
    fmt = (data.meta.get("formats") or {}).get(spec.name) or {}
    how = f", format {fmt['format']} ({fmt['chosen_by']})" if fmt.get("format") else ""
    return f"source {spec.name or spec.kind.value}: {spec.path}{how}"


def _tokenizer_line(cfg: Any, meta: dict[str, Any]) -> str:
    from align.data.tokenizer import tokenizer_dir

    return (f"tokenizer {tokenizer_dir(cfg.model)}, encode cache {'hit' if meta.get('cache_hit') else 'miss'} "
            f"({str(meta.get('encode_cache_key'))[:12]})")


def _counts(ids: list[int], mask: list[bool]) -> str:
    n_loss = sum(mask)
    return f"{len(ids)} tokens, {n_loss} in the loss ({n_loss / max(len(ids), 1):.1%})"


def chat_view(cfg: Any, tokenizer: Any, index: int) -> View:
    """SFT: record `index` of the encoded chat records (after truncation and drops), one sequence."""
    from align.data.encode_cache import load_dataset

    data = load_dataset(cfg.data, cfg.model, tokenizer)
    check_index(index, len(data), "the encoded data set has {n} records")
    ids, mask = (a.tolist() for a in data.row(index))
    # The encode keeps the first ids of the truncated records only: at the limit, say it may be one.
    truncated = data.ids[index] in (data.stats.get("truncated_ids") or [])
    at_limit = len(ids) == cfg.data.max_seq_len and cfg.data.truncation.value == "truncate"
    limit = cfg.data.max_seq_len
    return View(
        header=[f"record {index} of {len(data)} (id {data.ids[index]}, root {data.roots[index]}, "
                f"{_source(cfg, data, index)})",
                _counts(ids, mask) + (f"; truncated to data.max_seq_len={limit}" if truncated else
                                      f"; at data.max_seq_len={limit} (truncated, or exactly that long)" if at_limit
                                      else ""),
                _tokenizer_line(cfg, data.meta)],
        legend="tokens in the loss (the targets the model learns to predict); the rest: context only",
        sequences=[("", ids, mask)])


def pair_view(cfg: Any, tokenizer: Any, index: int) -> View:
    """DPO: pair `index` of the encoded pairs, both of its sequences (2i prompt + chosen, 2i + 1 prompt +
    rejected)."""
    from align.data.preference import SIDES, load_pairs

    pairs = load_pairs(cfg, tokenizer)
    check_index(index, pairs.pairs, "the encoded data set has {n} pairs")
    rows = [(side, *(a.tolist() for a in pairs.row(2 * index + k))) for k, side in enumerate(SIDES)]
    cut = f"; a side was cut at data.max_seq_len={cfg.data.max_seq_len}" if pairs.truncated[index] else ""
    return View(
        header=[f"pair {index} of {pairs.pairs} (id {pairs.pair_ids[index]}, root {pairs.roots[2 * index]}, "
                f"{_source(cfg, pairs, 2 * index)})",
                "; ".join(f"{side}: {_counts(ids, mask)}" for side, ids, mask in rows) + cut,
                _tokenizer_line(cfg, pairs.meta)],
        legend=f"tokens in the loss (each side's completion: its summed log-prob enters the pair's "
               f"objective.loss={cfg.objective.loss}); the rest: the prompt both sides share, context only",
        sequences=[(f"{side} (sequence {2 * index + k} of the encoded pairs)", ids, mask)
                   for k, (side, ids, mask) in enumerate(rows)])


def example_view(cfg: Any, tokenizer: Any, index: int) -> View:
    """KTO: example `index` of the encoded examples: its completion (2i) and its KL sequence (2i + 1)."""
    from align.data.unpaired import load_examples_encoded

    data = load_examples_encoded(cfg, tokenizer)
    check_index(index, data.pairs, "the encoded data set has {n} examples")
    rows = [a.tolist() for k in (0, 1) for a in data.row(2 * index + k)]
    partner = int(data.kl_partner[index])
    label = "desirable" if data.labels[index] else "undesirable"
    return View(
        header=[f"example {index} of {data.pairs} (id {data.pair_ids[index]}, {label}, root {data.roots[2 * index]}, "
                f"{_source(cfg, data, 2 * index)})",
                f"completion: {_counts(rows[0], rows[1])}; KL sequence: {_counts(rows[2], rows[3])}",
                _tokenizer_line(cfg, data.meta)],
        legend="tokens in the loss (their summed log-prob enters objective=kto); the rest: the prompt, context only",
        sequences=[(f"{label} completion (sequence {2 * index})", rows[0], rows[1]),
                   (f"KL sequence: this prompt with example {partner}'s completion ({data.pair_ids[partner]}), "
                    f"no gradient, its log-ratio averaged into the batch's KL point", rows[2], rows[3])])


def prompt_view(cfg: Any, tokenizer: Any, index: int) -> View:
    """GRPO: prompt `index` as the engine receives it. None of its tokens is in the loss, and neither is
    the reference answer: the loss is on completions generated from the prompt, the reference goes to
    the verifiers that score them."""
    from align.data.prompts import load_prompts
    from align.data.tokenizer import tokenizer_dir
    from align.rewards import WeightedReward

    reward = WeightedReward.of(cfg.reward)
    prompts = load_prompts(cfg, tokenizer, reward)
    check_index(index, len(prompts), "the prompt set has {n} prompts")
    ids = prompts.prompt(index)
    o = cfg.objective
    kl = f", plus objective.kl_coef={o.kl_coef} x the KL to the reference" if o.kl_coef else ""
    return View(
        header=[f"prompt {index} of {len(prompts)} (id {prompts.data.ids[index]}, root {prompts.data.roots[index]}, "
                f"{_source(cfg, prompts.data, index)})",
                f"{len(ids)} tokens, none in the loss: the prompt as the engine receives it (the chat template "
                "with its generation prompt)",
                f"tokenizer {tokenizer_dir(cfg.model)}, prompts encoded on load (no encode cache)"],
        legend="tokens in the loss: none here. objective=grpo trains on the completions it generates from this "
               "prompt, never on the record's answer",
        sequences=[("", ids, [False] * len(ids))],
        footer=[f"rollout: objective.group_size={o.group_size} completions of at most objective.max_new_tokens="
                f"{o.max_new_tokens} tokens are generated from this prompt (temperature={o.temperature}, "
                f"top_p={o.top_p}) and scored by reward.weights {reward.weights} against the reference answer",
                f"loss: the policy loss (objective.loss_agg={o.loss_agg.value}) over each completion's generated "
                f"tokens, weighted by its advantage in its group (objective.advantage={o.advantage.value}){kl}",
                f"reference answer, given to the verifier{'s' if len(reward.weights) > 1 else ''} "
                f"({', '.join(reward.weights)}), never trained on: {prompts.references[index]!r}"]
        + [f"{name}: {f.key} {f.spec} gets this prompt's completions with its rendered text "
           f"and its record's fields as keywords ({', '.join(sorted(prompts.columns[index]))})"
           for name, f in reward.functions.items()]
        + ([f"model: reward.path {reward.model_path} scores each completion with this prompt's messages, rendered "
            "through the reward model's own chat template"] if reward.model_path else []))


def distill_view(cfg: Any, tokenizer: Any, index: int) -> View:
    """objective=distill: prompt `index` as the engine receives it; the loss is on the student's own
    completions of it, scored token by token by the teacher; the record's answer is never read."""
    from align.data.prompts import NoReward, load_prompts
    from align.data.tokenizer import tokenizer_dir

    prompts = load_prompts(cfg, tokenizer, NoReward())
    check_index(index, len(prompts), "the prompt set has {n} prompts")
    ids = prompts.prompt(index)
    o = cfg.objective
    how = "reverse KL(student || teacher)" if o.loss.value == "reverse_kl" else f"TRL's generalised JSD (beta={o.beta})"
    return View(
        header=[f"prompt {index} of {len(prompts)} (id {prompts.data.ids[index]}, root {prompts.data.roots[index]}, "
                f"{_source(cfg, prompts.data, index)})",
                f"{len(ids)} tokens, none in the loss: the prompt as the engine receives it",
                f"tokenizer {tokenizer_dir(cfg.model)}, prompts encoded on load (no encode cache)"],
        legend="tokens in the loss: none here. objective=distill trains on the completions the student samples "
               "from this prompt",
        sequences=[("", ids, [False] * len(ids))],
        footer=[f"rollout: objective.group_size={o.group_size} completions of at most objective.max_new_tokens="
                f"{o.max_new_tokens} tokens are sampled from this prompt by the student (temperature={o.temperature}, "
                f"top_p={o.top_p})",
                f"loss: at each completion token, {how} over the full vocabulary against the teacher "
                f"{o.teacher}, averaged over completion tokens; the record's answer is never read"])


def rollout_view(cfg: Any, tokenizer: Any, path: str, index: int) -> View:
    """objective=grpo: sequence `index` of a recorded rollout, the one a checkpoint's rank<r>.json holds (the
    rollout buffer a resume replays: align/objectives/rollout.py `state_dict`), exactly as the run trains on
    it. A multi-turn trajectory (align/objectives/multi_turn.py) shows its turns in the loss and its tool
    messages between them out of it."""
    import json
    from pathlib import Path

    import numpy as np

    from align.errors import ConfigError
    from align.objectives.rollout import Rollout

    file = Path(path)
    file = file / "rank0.json" if file.is_dir() else file
    if not file.is_file():
        raise ConfigError("rollout", "accepted: a checkpoint dir (its rank0.json) or a rank<r>.json of one", path)
    state = (json.loads(file.read_text()).get("objective") or {}).get("rollout")
    if state is None:
        raise ConfigError("rollout", f"{file} holds no rollout (objective=grpo checkpoints keep their last one)", path)
    r = Rollout.from_state_dict(state)
    check_index(index, r.size, f"rollout {r.index} in {file} has {{n}} sequences")
    a, b = int(r.offsets[index]), int(r.offsets[index + 1])
    ids = r.tokens[a:b].tolist()
    mask = (r.loss_mask[a:b] if r.loss_mask is not None
            else np.arange(b - a) >= r.prompt_lens[index]).astype(bool).tolist()
    turns = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    lo, hi = r.completion_offsets()[index:index + 2]
    logps = r.engine_logps[lo:hi]
    return View(
        header=[f"sequence {index} of rollout {r.index} ({r.size} sequences, {file}): prompt row {int(r.rows[index])}, "
                f"group {int(r.group[index])}, reward {float(r.rewards[index]):g}, advantage "
                f"{float(r.advantages[index]):+.4f}, {'stopped' if r.stopped[index] else 'cut at a length bound'}",
                _counts(ids, mask) + f"; {turns} turn{'s' if turns != 1 else ''} of the model"],
        legend="tokens in the loss: the model's own generated tokens, each weighted by the advantage; the rest: the "
               "prompt, and between turns the tool messages and the template's tokens, context only",
        sequences=[("", ids, mask)],
        footer=[f"engine log-probs of its {len(logps)} loss tokens (the trainer's are compared with them): mean "
                f"{float(logps.mean()) if len(logps) else float('nan'):.4f}, the ratio's denominator under "
                f"objective.is_correction=tis"])
