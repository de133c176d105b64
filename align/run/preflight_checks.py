"""Preflight: every check that needs no tokenizer, encode or model load, run before anything heavy:
the pre-launch checklist (align/run/checklist.py; docs/provenance.md).

    python -m align.tools.preflight [overrides]      # prints the checklist for this config; exit 0 or 2

`align.train` runs the same checks first and stops at the first failure. Checks run cheapest first
(values, git, files), then the kwargs checks, which read the installed signatures through
align.core.signatures (a cache keyed on the files they come from; a miss imports the library). A check
is a function `(cfg, ctx) -> Iterable[Check]` listed in CHECKS; a kwargs call
site is a function `(cfg) -> KwargsSite | None` listed in align/run/kwargs_sites.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from align.config import AttnImpl, TrainConfig
from align.errors import AlignError, ConfigError
from align.run.checklist import Check, Context, Report, Status, _Stop
from align.run.kwargs_sites import check_kwargs_sites

# ------------------------------------------------------------------------------------- checks


def check_git(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.core.provenance import git_state

    g = git_state(ctx.root)
    if g.commit is None:
        yield Check("tree", "git", Status.warned, f"{g.reason}: the manifest records git as null with this reason")
        return
    where = f"{g.root} @ {g.describe}"
    if not g.dirty:
        yield Check("tree", "git", Status.passed, f"{where} (clean)")
    elif cfg.allow_dirty:
        yield Check(
            "tree",
            "git",
            Status.warned,
            f"{where}: {len(g.changed or [])} changed file(s), allowed by allow_dirty=true; "
            "the manifest records dirty + diff sha256",
        )
    else:
        files = ", ".join((g.changed or [])[:5]) + (" ..." if len(g.changed or []) > 5 else "")
        yield Check(
            "tree",
            "git",
            Status.failed,
            f"refusing to start: working tree {g.root} has uncommitted changes ({files}); the recorded commit "
            f"{g.commit[:12]} would not describe this run. Commit, or pass allow_dirty=true",
            "git",
        )


def check_files(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.data.sources import path_problem, source_specs  # stdlib + config only: no torch, no tokenizer

    yield Check("config", "values", Status.passed, "every group type- and value-checked by its dataclass")
    specs = source_specs(cfg.data)
    for spec in specs:  # every source of a mixture, JSONL or Parquet
        problem = path_problem(spec)
        yield Check("config", "data file", Status.failed if problem else Status.passed, problem or f"{spec.path}",
                    f"{spec.key}.path")
    yield from _token_rows(cfg, ctx, specs)
    if type(cfg.objective).reads_unpaired:  # its own record forms (align/data/unpaired.py), read whole
        yield from _unpaired_records(cfg, specs)
    else:
        yield from _record_formats(specs)
        if cfg.data.holds_pairs:
            yield from _pair_records(cfg, specs)
    for m in cfg.data.mask_files:
        ok = Path(m).is_file()
        yield Check(
            "config",
            "mask file",
            Status.passed if ok else Status.failed,
            m if ok else f"no such file: {m}",
            "data.mask_files",
        )
    yield from _eval_records(cfg)
    if cfg.model.pretrained:
        from align.models.checkpoint_files import checkpoint_problem
        from align.models.checkpoint_fit import family_problem

        d = Path(cfg.model.pretrained)
        problem = checkpoint_problem(d)
        yield Check(
            "config",
            "checkpoint dir",
            Status.failed if problem else Status.passed,
            problem or f"{d} (config.json parses; every safetensors file as long as its header says)",
            "model.pretrained",
        )
        problem = family_problem(cfg.model.family, d)
        yield Check("config", "checkpoint family", Status.failed if problem else Status.passed,
                    problem or _family_line(cfg), "model.pretrained")


def _family_line(cfg: TrainConfig) -> str:
    """What an accepted checkpoint builds; under model=hf, the family and class its model_type picks."""
    from align.config import Family
    from align.models.family import family_spec

    if cfg.model.family != Family.hf:
        return f"config.json's model_type and architectures are model={cfg.model.family.value}'s"
    try:
        spec = family_spec(cfg.model)
    except ConfigError as e:  # config.json unreadable: the checkpoint dir check says why
        return e.message
    if spec.name == Family.hf:
        return f"model_type {spec.model_type!r}: model=hf builds {spec.architecture} (AutoModelForCausalLM's class)"
    return f"model_type {spec.model_type!r}: model=hf runs as model={spec.name.value} ({spec.architecture})"


def _token_rows(cfg: TrainConfig, ctx: Context, specs: list) -> Iterable[Check]:
    """Pre-tokenized rows are read as the run reads them (types, masks, file:line), and their largest
    id is kept for the model's vocabulary check (align/run/model_checks.py): an id past the embedding
    otherwise surfaces after the tokenizer, the encode and the model build, without its line."""
    from align.config import Source
    from align.data.sources import load_records, path_problem, top_token

    if not any(s.kind == Source.tokens for s in specs) or any(path_problem(s) for s in specs):
        return
    try:
        records = load_records(cfg.data)
    except ConfigError as e:
        yield Check("config", "token rows", Status.failed, e.message, e.key)
        return
    ctx.facts["top_token"] = top = top_token(records)
    yield Check("config", "token rows", Status.passed,
                f"{len(records)} records" + (f", largest token id {top[0]} ({top[1]})" if top else ""))


def _unpaired_records(cfg: TrainConfig, specs: list) -> Iterable[Check]:
    """Every record parsed as the run parses it (no torch, no tokenizer): a bad one (a missing key, a
    label that is not a boolean) is refused naming its file:line before the run dir exists."""
    from align.data.preference import BadRecords
    from align.data.sources import path_problem
    from align.data.unpaired import load_examples

    if any(path_problem(s) for s in specs):
        return
    try:
        examples = load_examples(cfg.data, BadRecords(cfg.data.on_bad_record))
    except ConfigError as e:
        yield Check("config", "unpaired records", Status.failed, e.message, e.key)
        return
    yield Check("config", "unpaired records", Status.passed,
                f"{len(examples)} examples, {sum(e.label for e in examples)} desirable", "data")


def _pair_records(cfg: TrainConfig, specs: list) -> Iterable[Check]:
    """Every pair parsed as the run parses it (no torch, no tokenizer): a bad record, and for its `margin`
    (align/data/margins.py) one that is not a finite number, a margin on some pairs and not others, or margins
    under an objective that reads none, are refused naming the record's file:line before the run dir exists."""
    from align.data import margins
    from align.data.preference import BadRecords, load_preference_records
    from align.data.sources import path_problem

    if any(path_problem(s) for s in specs):
        return
    try:
        records = load_preference_records(cfg.data, BadRecords(cfg.data.on_bad_record))
        margins.check_column(records)
        column = margins.stats(records)
        margins.refuse_unread(column, cfg.objective)
    except ConfigError as e:
        yield Check("config", "pair records", Status.failed, e.message, e.key)
        return
    yield Check("config", "pair records", Status.passed,
                f"{len(records)} pairs, " + (f"'{margins.COLUMN}' on every pair (from {column['min']:g} to "
                                             f"{column['max']:g}), read by {cfg.objective.option}" if column
                                             else f"no '{margins.COLUMN}' field"), "data")


def _record_formats(specs: list) -> Iterable[Check]:
    """Each local file's record format, detected as the run detects it (align/data/formats.py, no torch):
    records that fit two formats, mix formats, fit none, or hold the other family's (pairs where chats
    are expected) are refused before the run dir exists, and the report says what was detected."""
    from align.config import DataFormat, Source
    from align.data import formats
    from align.data.sources import _rows, path_problem

    for spec in specs:
        if spec.kind.bundled or spec.kind == Source.tokens or path_problem(spec):
            continue
        if spec.format != DataFormat.auto:
            yield Check("config", "record format", Status.passed, f"{spec.name}: {spec.format.value} (named by "
                        f"{spec.format_key})", spec.format_key)
            continue
        try:
            rows = list(_rows(spec))
            fmt, _ = formats.resolve(rows, spec, spec.kind.pairs)
            first = next(((n, r) for n, r in rows if isinstance(r, dict)), None)
            if fmt is None and first is not None and not spec.kind.pairs:
                raise ConfigError(f"{spec.path}:{first[0]}",
                                  str(formats.no_format(first[1], spec, formats.CHAT_FORMATS)))
        except ConfigError as e:
            yield Check("config", "record format", Status.failed, e.message, e.key)
            continue
        what = fmt.value if fmt else "no record fits one"
        yield Check("config", "record format", Status.passed, f"{spec.name}: {what} (detected, {spec.file})",
                    f"{spec.key}.format")


def _eval_records(cfg: TrainConfig) -> Iterable[Check]:
    """The in-training eval's records load and every reference is readable (no torch, no tokenizer)."""
    if cfg.eval is None or cfg.trainer.eval_every == 0:
        return
    from align.evaluation.datasets import load_data
    from align.evaluation.scoring import build_scorer

    try:
        data = load_data(cfg.eval, getattr(build_scorer(cfg.eval), "verifier", None))
    except AlignError as e:
        key = getattr(e, "key", "eval.prompts")
        yield Check("config", "eval records", Status.failed, str(e).removeprefix(f"{key}: "), key)
        return
    yield Check("config", "eval records", Status.passed, f"{len(data.items)} records, sha256 {data.sha256[:12]}")


def check_attention(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """The family/machine support rule lives in align.models.attention (the build uses the same one)."""
    from align.config import Fallback
    from align.models.attention import unsupported_reason
    from align.models.family import family_spec

    def device_type() -> str:  # only the flash rule asks; resolving trainer.device=auto imports torch
        from align.parallel.env import resolve_device

        return resolve_device(cfg.trainer.device).type

    try:
        spec = family_spec(cfg.model)  # under model=hf, the family its checkpoint picks
    except ConfigError as e:  # the checkpoint checks said why
        yield Check("config", "attention backend", Status.failed, e.message, e.key)
        return
    impl = cfg.attention.chosen(spec.name)
    reason = unsupported_reason(spec, impl, device_type)
    if reason is None:
        auto = " (attention=auto's choice for the family)" if cfg.attention.implementation == AttnImpl.auto else ""
        yield Check(
            "config",
            "attention backend",
            Status.passed,
            f"{spec.name.value} supports {impl.value}{auto} (requested; the resolved one is recorded)",
        )
    elif cfg.attention.fallback == Fallback.allow:
        yield Check(
            "config",
            "attention backend",
            Status.warned,
            f"{reason}; fallback=allow: the library picks, the manifest records what it resolved to",
            "attention.implementation",
        )
    else:
        yield Check("config", "attention backend", Status.failed, reason, "attention.implementation")


def check_cache(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.core.hashing import tokenizer_hashes
    from align.data.sources import content_sha256, path_problem, source_specs
    from align.data.tokenizer import tokenizer_dir

    spec = source_specs(cfg.data)[0]
    problem = path_problem(spec)
    if problem is None:
        yield Check("cache", "data content hash", Status.passed,
                    f"{spec.path.name} sha256 {content_sha256(spec.path)[:16]}")
    else:
        yield Check("cache", "data content hash", Status.failed, f"cannot hash the data: {problem}", f"{spec.key}.path")
    tok_sha, tmpl_sha, _ = tokenizer_hashes(tokenizer_dir(cfg.model))
    if tok_sha:
        yield Check(
            "cache",
            "tokenizer + chat template hashes",
            Status.passed,
            f"tokenizer {tok_sha[:16]}, template {tmpl_sha[:16] if tmpl_sha else 'none'}",
        )
    try:
        key = encode_cache_key(cfg)
    except AlignError as e:  # a file the key covers is missing or unreadable
        yield Check("cache", "encode cache key", Status.failed, f"cannot compute: {e}", getattr(e, "key", None))
        return
    if key is None:
        yield Check(
            "cache", "encode cache key", Status.na, "this build has no encode cache: every run encodes from scratch"
        )
    else:
        yield Check("cache", "encode cache key", Status.passed,
                    f"{key[:16]} (content hashes, not paths; align.data.encode_cache)")


def encode_cache_key(cfg: TrainConfig) -> Optional[str]:
    """The key of the encode cache entry this config will use, from files only (align.data.encode_cache,
    when this build has an encode cache); None when it has none."""
    parts = _optional("align.data.encode_cache", "cache_key_parts")
    return None if parts is None else parts(cfg.data, cfg.model)["key"]


def _optional(module: str, attr: str) -> Optional[Callable]:
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


def check_device(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    from align.config import Device

    if cfg.trainer.device != Device.cuda:
        return
    import torch

    ok = torch.cuda.is_available()
    yield Check(
        "config",
        "device",
        Status.passed if ok else Status.failed,
        "CUDA available" if ok else "trainer.device=cuda but torch sees no CUDA device",
        "trainer.device",
    )


def check_compile_artifacts(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """trainer.compile_artifacts names a file torch can read, or one the run will write."""
    path = cfg.trainer.compile_artifacts
    if path is None:
        return
    from align.parallel.compile_artifacts import problem

    why = problem(path)
    yield Check("config", "compile artifacts", Status.failed if why else Status.passed,
                why or f"{path} ({'readable' if Path(path).exists() else 'written at the end of the run'})",
                "trainer.compile_artifacts")


def check_reward(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """Each python reward (reward.function, reward.functions) imported (once per process: the run reuses it)
    and its signature checked; the reward model (reward.path) read from its files
    (align/objectives/scoring_model.py)."""
    if cfg.reward.path is not None:
        from align.objectives.scoring_model import model_problem

        why, what = model_problem(cfg.reward.path)
        yield Check("config", "reward model", Status.failed if why else Status.passed, why or what, "reward.path")
        if why:
            return
    if cfg.reward.function is None and not cfg.reward.functions:
        return
    from align.rewards.combine import function_specs
    from align.rewards.function import function_key, load_function

    for name, spec in function_specs(cfg.reward.function, cfg.reward.functions).items():
        try:
            f = load_function(spec, function_key(name))
        except ConfigError as e:
            yield Check("config", f"reward function {name}", Status.failed, str(e).removeprefix(f"{e.key}: "), e.key)
            return
        yield Check("config", f"reward function {name}", Status.passed,
                    f"{f.spec} takes (prompts, completions, **kwargs); {f.file} sha256 {(f.sha256 or 'none')[:16]}")


def check_tools(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """Each tool of a multi-turn GRPO run (objective.tools) imported and callable."""
    specs = getattr(cfg.objective, "tools", None)
    if not specs:
        return
    from align.rewards.tool_calls import KEY, load_tool

    for i, spec in enumerate(specs):
        try:
            tool = load_tool(spec, f"{KEY}[{i}]")
        except ConfigError as e:
            yield Check("config", f"tool {spec}", Status.failed, str(e).removeprefix(f"{e.key}: "), e.key)
            return
        yield Check("config", f"tool {tool.name}", Status.passed, f"{tool.spec}; {tool.file} sha256 "
                    f"{(tool.sha256 or 'none')[:16]}")


def check_logger(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """The tracker's package is installed (found, not imported: importing it is the run's business)."""
    from align.telemetry.trackers import missing_package

    why = missing_package(cfg.logger.kind)
    if why is not None:
        yield Check("config", "logger", Status.failed, why, "logger")


def check_objective(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """The objective's own inputs, where its class checks any (`preflight(cfg)`: what was checked, or a
    ConfigError naming the key; objective=distill's teacher), before the model's checks read anything heavier."""
    from align.objectives import objective_class

    own = getattr(objective_class(cfg), "preflight", None)
    if own is None:
        return
    name = cfg.objective.option
    try:
        what = own(cfg)
    except ConfigError as e:
        yield Check("config", name, Status.failed, e.message, e.key)
        return
    yield Check("config", name, Status.passed, what)


def check_model(cfg: TrainConfig, ctx: Context) -> Iterable[Check]:
    """The checks that build the model on the meta device (torch is imported only when they run)."""
    from align.run.model_checks import model_checks

    yield from model_checks(cfg, ctx)


# Cheapest first: values, git and files fail in milliseconds, before any library import.
CHECKS: list[Callable[[TrainConfig, Context], Iterable[Check]]] = [
    check_files,
    check_logger,
    check_reward,
    check_tools,
    check_git,
    check_cache,
    check_attention,
    check_device,
    check_compile_artifacts,
    check_kwargs_sites,
    check_objective,
    check_model,
]


def collect(cfg: TrainConfig, root: Path | None = None, stop_on_fail: bool = False) -> Report:
    """Run every check; with `stop_on_fail`, stop at the first failure (align.train)."""
    from align.core.provenance import code_root

    t0 = time.perf_counter()
    ctx = Context(root=root or code_root(), stop_on_fail=stop_on_fail)
    try:
        for check in CHECKS:
            for c in check(cfg, ctx):
                ctx.add(c)
    except _Stop:
        pass
    return Report(ctx.checks, time.perf_counter() - t0, ctx.plan)


def run_preflight(cfg: TrainConfig, root: Path | None = None) -> Report:
    """The checks `align.train` runs first: raise ConfigError (exit 2) at the first failure."""
    report = collect(cfg, root=root, stop_on_fail=True)
    if not report.ok:
        raise report.failures[0].error()
    return report
