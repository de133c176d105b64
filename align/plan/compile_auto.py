"""What `trainer.compile`, `optimizer.compile` and `trainer.compile_loss` at `auto` stand for on the
device the run trains on: the switches, each with why (the manifest's `compile.trainer`,
`compile.optimizer` and `compile.loss`). Pure: no torch; what a resolved switch sets in this process
(the inductor cache, the artifacts, the partitioner's budget) is align/parallel/compile.py's."""

from __future__ import annotations

from typing import Any

from align.config.rules import AUTO

COMPILED_FAMILIES = ("mistral", "olmoe", "gemma4_moe")
"""Families whose compiled decoder blocks the GPU bench and tests have run (docs/performance.md)."""
COMPILED_ATTENTION = ("sdpa", "layered")


def resolve_trainer_compile(cfg: Any, device_type: str) -> tuple[bool, str]:
    """What `trainer.compile=auto` means on `device_type` for the TrainConfig `cfg`: on where the
    device is CUDA and the configuration is one the tests cover, with why; and only where the objective
    rules nothing out (align/objectives/grpo_terms.py `compile_off`: grpo's policy compiles only where
    the engine generates with a copy, so its blocks never see decode shapes). Pure: no torch."""
    t, why = cfg.trainer, []
    if device_type != "cuda":
        why.append(f"device {device_type}: compiling a CPU run costs more than it gives (auto compiles on CUDA)")
    if cfg.optimizer.overlap:
        why.append("optimizer.overlap=true steps on side streams a compiled block would trace")
    if cfg.parallel.kind.value not in ("single", "fsdp"):
        why.append(f"parallel={cfg.parallel.kind.value}: compiled blocks are tested under single and fsdp only")
    from align.models.family import family_of

    family = family_of(cfg.model)  # under model=hf, the family its checkpoint picks
    if family.value not in COMPILED_FAMILIES:
        why.append(f"model={family.value}: compiled blocks were run on the GPU for "
                   f"{', '.join(COMPILED_FAMILIES)} only")
    attention = cfg.attention.chosen(family).value
    if attention not in COMPILED_ATTENTION:
        why.append(f"attention={attention}: compiled blocks are tested with {', '.join(COMPILED_ATTENTION)} only")
    from align.objectives.plan_terms import terms_for

    why += terms_for(cfg).compile_off(cfg, device_type)
    return _verdict("trainer.compile", t.compile, why)


def blocks_compile(cfg: Any, device_type: str) -> bool:
    """Whether the decoder blocks will compile: `trainer.compile` as given, or auto resolved as the
    trainer will resolve it on `device_type` (for what is planned before the trainer resolves it)."""
    compiled = cfg.trainer.compile
    return resolve_trainer_compile(cfg, device_type)[0] if compiled == AUTO else bool(compiled)


def resolve_optimizer_compile(cfg: Any, device_type: str) -> tuple[bool, str]:
    """What `optimizer.compile=auto` means: on for torch's AdamW over full weights on one CUDA device
    (the tested case); off under LoRA (docs/performance.md#gemma-4-26b-a4b-lora)."""
    why = []
    if cfg.model.lora.enabled:
        # The adapters are a few hundred small tensors and a small share of the step: compiling their
        # update took longer than the whole bench arm on Gemma-4 26B-A4B, with nothing measured to gain.
        why.append("model.lora.enabled=true: the adapters' update is a small share of the step, and compiling it "
                   "over hundreds of small tensors costs minutes")
    if device_type != "cuda":
        why.append(f"device {device_type}: the compiled step is capturable, a CUDA feature")
    if cfg.optimizer.name.value != "adamw":
        why.append(f"optimizer={cfg.optimizer.name.value}: only torch's AdamW has a compiled step")
    if cfg.parallel.kind.value != "single":
        why.append(f"parallel={cfg.parallel.kind.value}: the compiled step is tested on plain tensors only")
    return _verdict("optimizer.compile", cfg.optimizer.compile, why)


def resolve_loss_compile(requested: Any, blocks: bool) -> tuple[bool, str]:
    """What `trainer.compile_loss=auto` means: what the blocks resolved to (`blocks`); the chunked
    loss's compiled elementwise passes were measured beside compiled blocks only."""
    if requested != AUTO:
        return bool(requested), f"trainer.compile_loss={str(requested).lower()} as configured"
    return blocks, f"trainer.compile_loss=auto follows trainer.compile (resolved {'on' if blocks else 'off'})"


def _verdict(key: str, requested: Any, why_off: list[str]) -> tuple[bool, str]:
    if requested != AUTO:
        return bool(requested), f"{key}={str(requested).lower()} as configured"
    if why_off:
        return False, f"{key}=auto resolved off: " + "; ".join(why_off)
    return True, f"{key}=auto resolved on: CUDA and a tested configuration"


def resolve_compile(cfg: Any, device_type: str) -> tuple[Any, dict[str, Any]]:
    """`cfg` with both compile switches resolved to bools for `device_type`, and the record of it (the
    manifest's `compile.trainer` / `compile.optimizer`: requested, resolved, why)."""
    import dataclasses

    blocks, blocks_why = resolve_trainer_compile(cfg, device_type)
    step, step_why = resolve_optimizer_compile(cfg, device_type)
    loss, loss_why = resolve_loss_compile(cfg.trainer.compile_loss, blocks)
    record = {
        "trainer": {"requested": cfg.trainer.compile, "resolved": blocks, "why": blocks_why},
        "optimizer": {"requested": cfg.optimizer.compile, "resolved": step, "why": step_why},
        "loss": {"requested": cfg.trainer.compile_loss, "resolved": loss, "why": loss_why},
    }
    resolved = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, compile=blocks, compile_loss=loss),
                                   optimizer=dataclasses.replace(cfg.optimizer, compile=step))
    return resolved, record
