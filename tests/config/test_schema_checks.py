"""The checks `to_typed` makes over every schema at once: non-finite floats, keys no schema declares
(with or without `+`), keys the composed option does not read, and error lines that name the right
schema. Each bad command line must end in exit 2 with one line on stderr naming the key."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from align.config import GROUP_SCHEMAS, OPTION_SCHEMAS, TrainConfig, schema_fields, to_typed
from align.errors import ConfigError
from align.run.cli import CONF_DIR, validate_command_line

# A dict-of-schema field is reached through an entry: the composition that provides one, and its name.
MAPPED = {"data.mixture": (["data=gsm8k_mix"], "train")}


def _float_keys(cls: type, key: str, base: tuple[str, ...] = ()):
    """(dotted key, override value template, base overrides) for every float of `cls`, nested ones too."""
    for name, tp in schema_fields(cls).items():
        k = f"{key}.{name}"
        if tp is float:
            yield k, "{}", base
        elif typing.get_origin(tp) is list and typing.get_args(tp)[0] is float:
            yield k, "[{}]", base
        elif dataclasses.is_dataclass(tp):
            yield from _float_keys(tp, k, base)
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            assert k in MAPPED, f"{k}: add the composition that gives it an entry to MAPPED"
            extra, entry = MAPPED[k]
            yield from _float_keys(typing.get_args(tp)[1], f"{k}.{entry}", (*base, *extra))


# A group whose default is null (no option composed) takes keys only once an option is chosen.
GROUP_BASE = {"eval": ("eval=gsm8k", "trainer.eval_every=1")}
FLOAT_KEYS = [fk for group, schema in GROUP_SCHEMAS.items() for fk in _float_keys(schema, group,
                                                                                   GROUP_BASE.get(group, ()))]


def _refused(capsys, *overrides: str) -> str:
    """The one stderr line of a refused command line (exit 2)."""
    with pytest.raises(SystemExit) as e:
        validate_command_line(list(overrides))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1, (e.value.code, err)
    assert err[0].startswith("align: error: "), err[0]
    return err[0].removeprefix("align: error: ")


def test_the_walk_finds_the_floats_the_issue_names():
    keys = {k for k, _, _ in FLOAT_KEYS}
    assert {"optimizer.lr", "optimizer.betas", "optimizer.eps", "optimizer.max_grad_norm", "optimizer.warmup_ratio",
            "model.lora.alpha", "model.moe.lb_weight", "data.mixture.train.weight",
            "probe.scaling.residual_tol"} <= keys


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("key,template,base", FLOAT_KEYS, ids=[k for k, _, _ in FLOAT_KEYS])
def test_every_float_of_every_schema_refuses_non_finite_values(capsys, key, template, base, bad):
    line = _refused(capsys, *base, f"{key}={template.format(bad)}")
    assert line.startswith(f"{key}: ") and "finite" in line, line


def test_a_non_finite_float_in_an_open_mapping_is_refused_too(capsys):
    line = _refused(capsys, "+model.overrides.rope_theta=-inf")
    assert line.startswith("model.overrides.rope_theta: ") and "finite" in line


# --------------------------------------------------------------------------- keys no schema declares


@pytest.mark.parametrize("group", sorted(GROUP_SCHEMAS))
@pytest.mark.parametrize("plus", ["", "+"])
def test_a_key_the_schema_lacks_is_refused_with_or_without_plus(capsys, group, plus):
    line = _refused(capsys, *GROUP_BASE.get(group, ()), f"{plus}{group}.not_a_key=1")
    assert line.startswith(f"{group}.not_a_key: unknown key in {group}") and "accepted keys: " in line, line


@pytest.mark.parametrize("plus", ["+", "++"])
def test_plus_with_a_typo_names_the_closest_key(capsys, plus):
    line = _refused(capsys, f"{plus}trainer.max_stepz=5")
    assert line.startswith("trainer.max_stepz: unknown key") and "did you mean trainer.max_steps?" in line


def test_a_nested_typo_lists_the_nested_schema_and_the_closest_name(capsys):
    line = _refused(capsys, "model.lora.enable=true")
    assert line.startswith("model.lora.enable: unknown key in model.lora (did you mean model.lora.enabled?)"), line
    assert "accepted keys: enabled, r, alpha" in line and "family" not in line
    line = _refused(capsys, "data=gsm8k_mix", "data.mixture.train.wieght=2")
    assert "did you mean data.mixture.train.weight?" in line and "accepted keys: kind, path" in line


def test_a_root_key_the_schema_lacks_is_refused(capsys):
    line = _refused(capsys, "+allow_dirtty=true")
    assert line.startswith("allow_dirtty: unknown key (did you mean allow_dirty?)"), line


def test_plus_still_adds_to_an_open_mapping(compose):
    typed = to_typed(compose(["+model.overrides.hidden_size=64", "+model.overrides.rope_theta=5000.0"]))
    assert typed.model.overrides == {"hidden_size": 64, "rope_theta": 5000.0}


def test_an_open_mapping_without_plus_keeps_hydras_hint(capsys):
    line = _refused(capsys, "model.overrides.hidden_size=64")
    assert line.startswith("model.overrides.hidden_size: ") and "+model.overrides.hidden_size=64" in line, line


# ------------------------------------------------------------------------- Hydra's own hints survive


def test_hydras_multirun_hint_is_kept_on_one_line(capsys):
    line = _refused(capsys, "optimizer.lr=1e-4,3e-4")
    assert "optimizer.lr=1e-4,3e-4" in line and "--multirun" in line and "key=[value1,value2]" in line, line


def test_hydras_append_hint_is_kept_on_one_line(capsys):
    line = _refused(capsys, "+trainer.grad_accum=3")
    assert "'++trainer.grad_accum=3'" in line, line


# ---------------------------------------------------------------- keys the composed option ignores


IGNORED = [
    (["data.path=/my/file.jsonl"], "data.path",
     "ignored by data=gsm8k; it is read by data=jsonl, data=parquet, data=tokens"),
    (["data=jsonl", "data.path=/x.jsonl", "data.split=test"], "data.split",
     "ignored by data=jsonl; it is read by data=gsm8k"),
    (["data=jsonl", "data.path=/x.jsonl", "data.tokens_field=ids"], "data.tokens_field", "read by data=tokens"),
    (["data=tokens", "data.path=/x.jsonl", "data.prompt_field=q"], "data.prompt_field", "ignored by data=tokens"),
    (["data=gsm8k_mix", "data.path=/x.jsonl"], "data.path", "ignored when data.mixture is set"),
    (["data=gsm8k_mix", "data.source=jsonl"], "data.source", "ignored when data.mixture is set"),
    (["data=gsm8k_mix", "data.tokens_field=ids"], "data.tokens_field", "no source of data.mixture with kind tokens"),
    (["data=gsm8k_mix", "data.mixture.train.path=/x.jsonl"], "data.mixture.train.path",
     "ignored by data.mixture.train.kind=gsm8k; it is read when data.mixture.train.kind is jsonl or parquet or tokens"),
    (["data.cache=false", "data.cache_dir=/tmp/c"], "data.cache_dir", "ignored when data.cache=false"),
    (["sampler=shuffle", "sampler.bucket_size=32"], "sampler.bucket_size",
     "ignored by sampler=shuffle; it is read by sampler=bucket, sampler=budget"),
    (["sampler=bucket", "sampler.max_tokens=512"], "sampler.max_tokens", "read by sampler=budget"),
    (["sampler=budget", "sampler.micro_batch_size=4"], "sampler.micro_batch_size", "ignored by sampler=budget"),
    (["attention=eager", "attention.sdpa_kernels=[math]"], "attention.sdpa_kernels", "read by attention=sdpa"),
    (["parallel.ep_size=2"], "parallel.ep_size", "ignored by parallel=single; it is read by parallel=ep"),
    (["parallel.param_dtype=bfloat16"], "parallel.param_dtype", "read by parallel=fsdp, parallel=ep"),
    (["parallel=ep", "parallel.reshard_after_forward=false"], "parallel.reshard_after_forward",
     "read by parallel=fsdp"),
    (["parallel.pg_timeout_s=30"], "parallel.pg_timeout_s", "ignored by parallel=single"),
    (["parallel.flight_recorder_entries=10"], "parallel.flight_recorder_entries", "ignored by parallel=single"),
    (["logger=none", "logger.project=x"], "logger.project", "ignored by logger=none; it is read by logger=wandb"),
    (["logger=tensorboard", "logger.project=x"], "logger.project",
     "ignored by logger=tensorboard; it is read by logger=wandb, logger=mlflow"),
    (["trainer.compile=false", "trainer.compile_dynamic=false"], "trainer.compile_dynamic",
     "ignored unless trainer.compile=true or auto"),
    (["model.lora.r=4"], "model.lora.r", "ignored unless model.lora.enabled=true"),
    (["model.pretrained=/ckpt", "model.preset=full"], "model.preset", "ignored when model.pretrained is set"),
    (["model=olmoe", "parallel=ep", "model.init_on_device=true"], "model.init_on_device", "ignored by parallel=ep"),
    (["probe.scaling.warmup=3"], "probe.scaling.warmup",
     "ignored by align.train; it is read by `python -m align.tools.probe probe=scaling`"),
]


@pytest.mark.parametrize("overrides,key,why", IGNORED, ids=[f"{k}:{' '.join(o)}" for o, k, _ in IGNORED])
def test_a_set_key_the_composed_option_ignores_is_refused(capsys, overrides, key, why):
    line = _refused(capsys, *overrides)
    assert line.startswith(f"{key}: ") and why in line, line
    for group, option in re.findall(r"\b([a-z]+)=([a-z0-9_]+)\b", line.split("; ", 1)[-1]):
        if group in GROUP_SCHEMAS:  # a reader named as an option is one the user can compose
            assert (CONF_DIR / group / f"{option}.yaml").is_file(), f"{group}={option} in {line!r}"


READ = [
    ["data=jsonl", "data.path=/x.jsonl", "data.prompt_field=q"],
    ["data=tokens", "data.path=/x.jsonl", "data.tokens_field=ids"],
    ["data=gsm8k_mix", "data.prompt_field=q", "data.mixture.test.split=train"],
    ["sampler=bucket", "sampler.bucket_size=32", "sampler.micro_batch_size=4"],
    ["sampler=budget", "sampler.max_tokens=512", "sampler.bucket_size=8"],
    ["sampler.packed=true", "sampler.mask_padding=true"],
    ["sampler.packed=true"],  # the default budget option presets mask_padding=false: a packed row has no padding
    ["attention.sdpa_kernels=[math]"],
    ["parallel=fsdp", "parallel.param_dtype=float32", "parallel.reshard_after_forward=false",
     "parallel.pg_timeout_s=30"],
    ["model=olmoe", "parallel=ep", "parallel.ep_size=2"],
    ["logger.project=x", "logger.tags=[a]"],
    ["trainer.compile=true", "trainer.compile_dynamic=false"],
    ["model.lora.enabled=true", "model.lora.r=4"],
    ["model.pretrained=/ckpt", "+model.overrides.rope_theta=5000.0"],
    ["model.init_on_device=true"],
]


@pytest.mark.parametrize("overrides", READ, ids=[" ".join(o) for o in READ])
def test_the_same_keys_are_accepted_where_they_are_read(compose, overrides):
    to_typed(compose(overrides))


def test_a_probe_reads_its_own_options_and_refuses_another_probes(compose, capsys):
    typed = to_typed(compose(["probe=scaling", "probe.scaling.warmup=3", "sampler=budget",
                              "sampler=shuffle", "sampler.micro_batch_size=4"], config_name="probe"))
    assert typed.probe.scaling.warmup == 3 and typed.sampler.micro_batch_size == 4  # the scaling probe reads both
    with pytest.raises(ConfigError, match=r"probe.kernels.steps: ignored by probe=scaling; it is read by probe=kern"):
        to_typed(compose(["probe=scaling", "probe.kernels.steps=5"], config_name="probe"))


SWITCH = {"data": "source", "sampler": "kind", "attention": "implementation", "optimizer": "name", "parallel": "kind",
          "logger": "kind", "model": "family"}


@pytest.mark.parametrize("group", sorted(SWITCH))
def test_options_are_named_after_the_choice_they_make(compose, tmp_path, group):
    """The messages above name `group=<choice>` as the option to compose: true only while each option
    file is named after the value it gives the group's switch field."""
    for f in sorted((CONF_DIR / group).glob("*.yaml")):
        reads_a_file = group == "data" and f.stem in ("jsonl", "parquet", "tokens", "preference", "jsonl_prompts")
        extra = [f"data.path={tmp_path / 'x.jsonl'}"] if reads_a_file else []
        if group == "data" and f.stem in ("preference", "gsm8k_pairs"):
            extra.append("objective=dpo")
        if group == "model" and f.stem == "hf":
            extra.append(f"model.pretrained={tmp_path}")  # no presets: a checkpoint dir is required
        typed: TrainConfig = to_typed(compose([f"{group}={f.stem}", *extra]))
        if group == "data" and typed.data.mixture:
            continue  # a mixture names its sources, not data.source
        value = getattr(getattr(typed, group), SWITCH[group]).value
        # The messages name `group=<value>`: an option of that name must exist and set that value
        # (an option may also preset more, as data=gsm8k_prompts does for data.source=gsm8k).
        assert (CONF_DIR / group / f"{value}.yaml").is_file(), f
        if f.stem != value:
            files = ("jsonl", "parquet", "tokens", "preference")
            path = [f"data.path={tmp_path / 'x.jsonl'}"] if value in files else []
            named = to_typed(compose([f"{group}={value}", *path]))
            assert getattr(getattr(named, group), SWITCH[group]).value == value, f


# ----------------------------------------------------------------- values checked before heavy work


@pytest.mark.parametrize("override,key,why", [
    ("optimizer.betas=[0.9,1.5]", "optimizer.betas", "each beta must be in [0, 1)"),
    ("optimizer.betas=[-0.1,0.9]", "optimizer.betas", "each beta must be in [0, 1)"),
    ("optimizer.betas=[0.9,1.0]", "optimizer.betas", "each beta must be in [0, 1)"),
    ("optimizer.eps=0", "optimizer.eps", "must be > 0"),
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay", "must be >= 0"),
])
def test_optimizer_values_torch_would_refuse_at_step_one_are_refused_at_compose(capsys, override, key, why):
    line = _refused(capsys, override)
    assert line.startswith(f"{key}: {why}"), line


def test_an_error_inside_a_mapping_entry_names_the_entry_in_full(capsys):
    line = _refused(capsys, "+data.mixture.extra={kind:jsonl,path:/x.jsonl}")
    assert line.startswith("data.mixture.extra: "), line


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_numpy_or_torch_cannot_take_is_refused_at_compose(capsys, seed):
    import numpy as np
    import torch

    with pytest.raises((ValueError, RuntimeError)):  # what the run would have hit once the model was built
        np.random.default_rng([seed, 0])
        torch.Generator().manual_seed(seed)
    line = _refused(capsys, f"trainer.seed={seed}")
    assert line == f"trainer.seed: must be from 0 to 2**64 - 1 (got {seed})", line


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_the_seeds_at_either_end_of_the_range_seed_numpy_and_torch(seed):
    import numpy as np
    import torch

    assert validate_command_line([f"trainer.seed={seed}"])[0].trainer.seed == seed
    np.random.default_rng([seed, 0])
    torch.manual_seed(seed)


FOREIGN = {"learning_rate": "optimizer.lr", "per_device_train_batch_size": "sampler.micro_batch_size",
           "gradient_accumulation_steps": "trainer.grad_accum", "num_train_epochs": "trainer.epochs",
           "output_dir": "hydra.run.dir", "save_steps": "trainer.save_every", "max_length": "data.max_seq_len",
           "loss_type": "objective.loss (objective=dpo)", "warmup_ratio": "optimizer.warmup_ratio",
           "lr_scheduler_type": "optimizer.schedule", "logging_steps": "trainer.log_every", "seed": "trainer.seed",
           "beta": "objective.beta (objective=dpo)"}


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_a_transformers_or_trl_name_is_answered_with_aligns_key(capsys, name):
    want = FOREIGN[name]
    line = _refused(capsys, f"{name}=1")
    assert line.startswith(f"{name}: unknown key (transformers/TRL's {name}: align's key is {want}"), line
    dotted, _, option = want.partition(" (")
    group, _, key = dotted.partition(".")
    if group != "hydra":  # the key named is one the schema declares: the group's, or the named option's own
        schema = schema_fields(TrainConfig)[group]
        if option:
            schema = OPTION_SCHEMAS[group][option.removesuffix(")").removeprefix(f"{group}=")]
        assert key in schema_fields(schema)
    if group != "trainer":  # under a group too, e.g. trainer.learning_rate
        assert f"align's key is {want}" in _refused(capsys, f"+trainer.{name}=1")
