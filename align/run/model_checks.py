"""The model's preflight checks: everything about the model that can be decided before the tokenizer,
the encode or any weight is touched (except that GRPO's memory plan reads its prompts, with the
tokenizer, to size the rollouts: align/plan/budget_auto.py `plan_rollout`). Registered in
`align.run.preflight_checks.CHECKS`; yields `align.run.preflight_checks.Check` rows (a failure names the config
key to change):

- config kwargs (preset + overrides) accepted by the installed config class (also a kwargs site)
- the largest id of pre-tokenized rows inside every token-id table (naming its file:line)
- attention backend supported by the family and the machine (else refused, or fallback=allow)
- router losses only on MoE models; QLoRA only on dense families, with a checkpoint
- a scalar head (objective=reward_model) only on a family transformers has a sequence-classification
  class for, and without LoRA (align/models/scalar_head.py)
- LoRA targets discovered (the peft / bitsandbytes kwargs are kwargs sites: `lora_site`, `qlora_site`)
- parameter count (total, active for MoE, trainable) and a training-memory estimate, refused when it
  exceeds the visible device unless `model.allow_over_memory=true`, naming the keys of this composition
  that lower it (align/plan/memory_levers.py). The estimate is the job's plan's (align/plan/planner.py),
  made here once and carried by the report to the manifest and Trainer.build.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from align.config import TrainConfig
from align.errors import ConfigError
from align.models.attention import resolve_attention
from align.models.build import check_router_losses, token_id_tables
from align.models.family import family_spec
from align.models.lora import discover_targets, qlora_refusal
from align.plan.generation_auto import rollout_width
from align.plan.memory import meta_model
from align.plan.memory_levers import levers
from align.plan.planner import plan


def _device(cfg: TrainConfig) -> torch.device:
    from align.parallel.env import job_device

    return job_device(cfg.trainer.device)


def _token_ids(model: torch.nn.Module, top: Optional[tuple[int, str]]) -> Iterator:
    """The largest id of pre-tokenized rows (align/run/preflight_checks.py reads them) against every table
    indexed by token ids; the meta model has the run's sizes, so no weight is loaded. The trainer's
    `check_token_ids` stays for runs built without preflight."""
    from align.run.checklist import Check, Status

    if top is None:
        return
    tables = token_id_tables(model)
    over = {what: vocab for what, vocab in tables.items() if top[0] >= vocab}
    if not over:
        yield Check("config", "token ids", Status.passed, f"largest id {top[0]} < {min(tables.values())}")
        return
    what, vocab = min(over.items(), key=lambda kv: kv[1])
    yield Check("config", "token ids", Status.failed,
                f"token id {top[0]} is out of the model's vocabulary (size {vocab}, {what}); accepted: ids below "
                f"{vocab} (set the model's vocabulary to match, or use data tokenized for this model)", top[1])


def model_checks(cfg: TrainConfig, ctx: Any = None, shards: int = 1) -> Iterator:
    from align.run.checklist import Check, Status

    def failed(item: str, name: str, e: ConfigError):
        return Check(item, name, Status.failed, e.message + ("" if e.value is None else f" (got {e.value!r})"), e.key)

    m = cfg.model
    device = _device(cfg)
    try:
        spec = family_spec(m)  # under model=hf, the family its checkpoint picks
        model, config = meta_model(m)  # preset + override names are checked while building it
    except ConfigError as e:
        yield failed("config", "model config (meta build)", e)
        return
    if type(cfg.objective).scalar_head:  # before anything is sized: the model would be another class
        from align.models.scalar_head import head_refusal

        why = head_refusal(spec, cfg.objective.option, m.lora.enabled)
        if why:
            yield Check("config", "scalar head", Status.failed, why[1], why[0])
            return
    moe = spec.moe_shape(config)
    yield from _token_ids(model, getattr(ctx, "facts", {}).get("top_token"))

    try:
        attn = resolve_attention(spec, cfg.attention, device.type)
        yield Check("config", "attention resolution (align.models)",
                    Status.passed if attn.reason is None else Status.warned,
                    attn.hf_name if attn.reason is None else
                    f"requested {attn.requested.hf_name}, runs {attn.hf_name}: {attn.reason}",
                    "attention.implementation")
    except ConfigError as e:
        yield failed("config", "attention resolution (align.models)", e)

    try:
        check_router_losses(m, moe)
        if moe is not None:
            yield Check("config", "router losses", Status.passed,
                        f"lb_weight={m.moe.lb_weight} z_weight={m.moe.z_weight} applied "
                        f"(E={moe.num_experts}, top-{moe.top_k}; "
                        f"experts kernel requested: {m.moe.experts.value if m.moe.experts else 'library default'})")
    except ConfigError as e:
        yield failed("config", "router losses", e)

    refusal = qlora_refusal(m, moe is not None and spec.fused_experts)
    if refusal:
        yield Check("config", "qlora", Status.failed, refusal, "model.lora.qlora")
    if m.lora.enabled:
        try:
            s = discover_targets(model, m.lora.target_modules).summary()
            yield Check("config", "lora targets", Status.passed,
                        f"{s['target_modules']} modules {s['targets']}; not adapted: "
                        f"{s['skipped_fused_expert_params'] + s['not_adapted_linears']}", "model.lora")
        except ConfigError as e:
            yield failed("config", "lora targets", e)
            return  # the memory estimate counts the adapters of these targets

    try:  # the job's plan: the sizes the trainer will take; under grpo the rollouts at the real prompts' width
        job = plan(cfg, device, shards)
    except ConfigError as e:  # grpo reads its prompts to plan: a prompt or reference the run would refuse
        yield failed("config", "params and memory", e)
        return
    if ctx is not None:  # the report carries it to the manifest's serving line and Trainer.build
        ctx.plan = job
    est, planned, prompt_tokens = job.estimate, job.sized, job.prompt_tokens
    line = est.line()
    if prompt_tokens is not None:
        line += (f"; rollout sequences of at most {rollout_width(planned, prompt_tokens)} tokens (the longest "
                 f"prompt, {prompt_tokens}, + objective.max_new_tokens)")
    if est.fits is False and not m.allow_over_memory:
        found = levers(planned, device, shards, prompt_tokens)
        lower = f"each of these lowers it: {', '.join(found)}" if found else "no key of this composition lowers it"
        yield Check("config", "params and memory", Status.failed,
                    f"the training-memory estimate does not fit: {line}; {lower}; or set model.allow_over_memory=true",
                    "model.allow_over_memory")
    elif est.fits is False:
        yield Check("config", "params and memory", Status.warned, line + " (allowed by model.allow_over_memory)")
    else:
        yield Check("config", "params and memory", Status.passed, line)
