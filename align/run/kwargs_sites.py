"""The kwargs call sites preflight checks by name (docs/pitfalls.md#7), one function per library call.

Each function builds the kwargs with the SAME builder the call site uses, and names the installed
callable it goes to; it returns None when this config does not make that call. Values are
placeholders only where the real value needs heavy work (the tokenizer's vocab size): the names are
what is checked. Listed in `KWARGS_SITES` at the end of this module.

Targets are import paths and the builders import neither torch nor transformers, so on the default
config a refused name costs no library import when align.core.signatures' cache is current.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from align.config import Device, LoggerKind, LoraExport, ParallelKind, TrainConfig
from align.core.signatures import KwargsSite, unknown_kwargs
from align.errors import AlignError
from align.run.checklist import Check, Context, Status


def check_site(name: str, site: KwargsSite) -> Check:
    try:
        unknown, acc = unknown_kwargs(site)
    except Exception as e:  # the callable is missing or not importable: that is a failure too
        return Check("kwargs", name, Status.failed,
                     f"cannot read the installed callable {site.target!r}: {type(e).__name__}: {e}", site.key)
    if unknown and site.exact is not None:  # the union over devices was refused: decide on this machine's
        return check_site(name, site.exact())
    if unknown:
        return Check("kwargs", name, Status.failed,
                     f"{acc.name} does not accept {unknown}; it accepts: {', '.join(sorted(acc.names))}", site.key)
    union = "; the names of every device trainer.device=auto may pick" if site.exact else ""
    return Check("kwargs", name, Status.passed, f"{len(site.kwargs)} names ok against {acc.name} ({acc.how}){union}",
                 site.key)





class TokenizerShape:
    """Stands in for the tokenizer where only the NAMES of the kwargs built from it matter."""

    pad_token_id = bos_token_id = eos_token_id = 0

    def __len__(self) -> int:
        return 0


def _device(cfg: TrainConfig):
    from align.parallel.env import resolve_device

    return resolve_device(cfg.trainer.device)


def wandb_init(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.logger.kind != LoggerKind.wandb:
        return None
    from align.telemetry.wandb_logger import wandb_init_kwargs

    return KwargsSite("wandb:init", wandb_init_kwargs(cfg.logger, Path("."), "preflight", None, {}), "logger")


def wandb_model_artifact(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.logger.kind != LoggerKind.wandb or not cfg.logger.log_model:
        return None
    from align.telemetry.wandb_logger import artifact_kwargs

    return KwargsSite("wandb:Artifact", artifact_kwargs("preflight", 0, Path("export"))[0], "logger.log_model")


def wandb_log_artifact(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.logger.kind != LoggerKind.wandb or not cfg.logger.log_model:
        return None
    from align.telemetry.wandb_logger import artifact_kwargs

    return KwargsSite("wandb.sdk.wandb_run:Run.log_artifact", artifact_kwargs("preflight", 0, Path("export"))[1],
                      "logger.log_model")


def tensorboard_writer(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.logger.kind != LoggerKind.tensorboard:
        return None
    from align.telemetry.trackers import tensorboard_kwargs

    return KwargsSite("torch.utils.tensorboard:SummaryWriter", tensorboard_kwargs(Path("."), 1), "logger")


def mlflow_create_run(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.logger.kind != LoggerKind.mlflow:
        return None
    from align.telemetry.trackers import mlflow_run_kwargs

    return KwargsSite("mlflow.tracking:MlflowClient.create_run",
                      {"experiment_id": "0", **mlflow_run_kwargs(cfg.logger, "preflight")}, "logger")


def _per_device(cfg: TrainConfig, target: str, key: str, build: Callable[[str], dict[str, Any]]) -> KwargsSite:
    """A site whose kwargs depend on the device type. trainer.device=auto is decided by
    torch.cuda.is_available(), and importing torch costs a second: the names the call would get on
    either device are checked at once, and the device is resolved only when that union is refused."""
    if cfg.trainer.device != Device.auto:
        return KwargsSite(target, build(cfg.trainer.device.value), key)
    return KwargsSite(target, {**build("cpu"), **build("cuda")}, key,
                      exact=lambda: KwargsSite(target, build(_device(cfg).type), key))


def data_loader(cfg: TrainConfig) -> KwargsSite:
    from align.data.loader_kwargs import NUM_WORKERS, loader_kwargs

    # Mirrors Trainer.build: BatchStream's worker count and pin_memory on CUDA.
    return _per_device(cfg, "torch.utils.data:DataLoader", "data",
                       lambda dev: loader_kwargs(NUM_WORKERS, dev == "cuda"))


def optimizer(cfg: TrainConfig) -> KwargsSite:
    from align.optim import optimizer_kwargs, optimizer_target

    # Mirrors build_optimizer: under fsdp/ep every parameter is a DTensor.
    target = optimizer_target(cfg.optimizer, sharded=cfg.parallel.kind != ParallelKind.single)
    return _per_device(cfg, target, "optimizer", lambda dev: optimizer_kwargs(cfg.optimizer, dev))


def scheduler(cfg: TrainConfig) -> KwargsSite:
    from align.optim import scheduler_kwargs, scheduler_target

    opt = cfg.optimizer
    # the names are what is checked: under trainer.epochs the length is known once the data is planned
    return KwargsSite(scheduler_target(opt), scheduler_kwargs(opt, cfg.trainer.max_steps or 1), "optimizer")


def model_config(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.model.pretrained:
        return None  # the checkpoint's config.json is loaded, not built from kwargs
    from align.models.family import family_spec
    from align.models.kwargs import config_kwargs

    # The config class's __post_init__ consumes names its signature lacks (Gemma4TextConfig:
    # global_head_dim): align.core.signatures reads those from its installed source too.
    return KwargsSite(family_spec(cfg.model).config_class, config_kwargs(cfg.model, TokenizerShape()),
                      "model.overrides")


def model_load(cfg: TrainConfig) -> KwargsSite:
    from align.models.family import family_spec
    from align.models.kwargs import REPORT_KWARGS, load_kwargs

    spec = family_spec(cfg.model)
    kw = load_kwargs(cfg.model, cfg.attention)
    if cfg.model.pretrained:
        # from_pretrained hands leftover kwargs to the config class: its names count too.
        return KwargsSite(f"{spec.model_class}.from_pretrained", {**kw, "local_files_only": True, **REPORT_KWARGS},
                          "model", also=(spec.config_class,))
    return KwargsSite(f"{spec.model_class}._from_config", kw, "model", also=(spec.model_class,))


def activation_checkpointing(cfg: TrainConfig) -> Optional[KwargsSite]:
    if not cfg.parallel.activation_checkpointing:
        return None
    from align.models.family import family_spec
    from align.parallel.wrap import activation_checkpointing_call

    _, model_cls = family_spec(cfg.model).classes()
    if cfg.parallel.activation_checkpointing_fraction < 1:  # refused here, not at build, when blocks lack the switch
        from align.parallel.wrap import checkpointing_plan
        from align.plan.memory import meta_model

        checkpointing_plan(meta_model(cfg.model)[0], cfg.parallel.activation_checkpointing_fraction)
    method, kwargs = activation_checkpointing_call(model_cls)  # the call parallelize() makes
    return KwargsSite(getattr(model_cls, method), kwargs, "parallel.activation_checkpointing")


def compile_blocks(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.trainer.compile is False:  # auto may resolve on once the device is known: check its kwargs too
        return None
    from align.parallel.compile import COMPILE, compile_kwargs

    return KwargsSite(COMPILE, compile_kwargs(cfg.trainer.compile_dynamic), "trainer.compile_dynamic")


def lora_site(cfg: TrainConfig) -> Optional[KwargsSite]:
    """peft.LoraConfig's kwargs, as apply_lora builds them (from the model built on the meta device)."""
    if not cfg.model.lora.enabled:
        return None
    from align.models.lora import discover_targets, lora_kwargs
    from align.plan.memory import meta_model

    model, _ = meta_model(cfg.model)
    targets = discover_targets(model, cfg.model.lora.target_modules)  # a name the model lacks: refused here
    return KwargsSite("peft:LoraConfig", lora_kwargs(cfg.model.lora, targets), "model.lora")


def qlora_site(cfg: TrainConfig) -> Optional[KwargsSite]:
    """transformers.BitsAndBytesConfig's kwargs for a QLoRA base."""
    if not (cfg.model.lora.enabled and cfg.model.lora.qlora):
        return None
    from align.models.lora import bnb_kwargs

    return KwargsSite("transformers:BitsAndBytesConfig", bnb_kwargs(), "model.lora.qlora")


def adapter_save_site(cfg: TrainConfig) -> Optional[KwargsSite]:
    """peft's PeftModel.save_pretrained for the adapter export (align.models.adapter)."""
    lora = cfg.model.lora
    if not (lora.enabled and cfg.trainer.export and lora.export != LoraExport.merged):
        return None
    from align.models.adapter import SAVE_KWARGS

    sharded = {} if cfg.parallel.kind == ParallelKind.single else {"state_dict": None}  # the gathered tensors
    return KwargsSite("peft:PeftModel.save_pretrained", {**SAVE_KWARGS, **sharded}, "model.lora.export")


# Every kwargs call site, in the order checked: name -> function of the TrainConfig returning a
# KwargsSite, or None when this config does not make that call. Register a new one with one line.
KWARGS_SITES: dict[str, Callable[[TrainConfig], Optional[KwargsSite]]] = {
    "wandb.init": wandb_init,
    "wandb model artifact": wandb_model_artifact,
    "wandb log_artifact": wandb_log_artifact,
    "tensorboard SummaryWriter": tensorboard_writer,
    "mlflow create_run": mlflow_create_run,
    "DataLoader": data_loader,
    "optimizer": optimizer,
    "model config class": model_config,
    "model from_pretrained/_from_config": model_load,
    "activation checkpointing": activation_checkpointing,
    "lr scheduler": scheduler,
    "torch.compile of the blocks": compile_blocks,
    "peft LoraConfig": lora_site,
    "bitsandbytes 4-bit config": qlora_site,
    "peft adapter export": adapter_save_site,
}


def check_kwargs_sites(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    for name, build in KWARGS_SITES.items():
        try:
            site = build(cfg)
        except AlignError as e:  # the Check's error puts the key back in front
            key = getattr(e, "key", None)
            yield Check("kwargs", name, Status.failed, str(e).removeprefix(f"{key}: ") if key else str(e), key)
            continue
        except Exception as e:
            yield Check("kwargs", name, Status.failed, f"building the kwargs failed: {type(e).__name__}: {e}")
            continue
        if site is None:
            yield Check("kwargs", name, Status.na, "not called by this config")
        else:
            yield check_site(name, site)

