"""README.md's recipes run as written.

Every recipe line of the README (the indented command lines of "Recipes" and "Scale out", and the
Quick start's `align ...` lines) is classified here: SKIPPED (with why it cannot run on a CPU test
machine) or run. A recipe that is run keeps every argument it has; the test appends only test-size
additions (a couple of steps, a few records, no W&B, a run dir under tmp, allow_dirty) and replaces
only the placeholders of SUBSTITUTED, most of them with the output of an earlier recipe of the same
test. A README line that is in neither list fails `test_every_recipe_line_is_classified...`, so a new
recipe gets classified when it is written.

The runs go in-process through `align <command>` (align/__main__.py), each as its CLI would run it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_hf_checkpoint

SKIPPED = {
    "align supervise max_no_progress=3 -- launchers/torchrun.sh --nproc 8 ...":
        "relaunches 8 GPU processes (torchrun --nproc 8); tests/unit/control/test_supervisor.py holds the supervisor",
    "align docs":
        "rewrites docs/configuration.md inside the repo; tests/config/test_docs.py checks that same generation",
    "python -m align.train data=jsonl data.path=/data/chat.jsonl model.pretrained=/ckpt/Mistral-7B-v0.3":
        "a user's data file (/data/...) and a 7B checkpoint (/ckpt/...)",
    "launchers/torchrun.sh --nproc 8 parallel=fsdp model=olmoe model.pretrained=/ckpt/OLMoE-1B-7B-0125 "
    "trainer.save_every=200":
        "8 GPUs and a 7B checkpoint; tests/integration/test_launchers.py runs the launcher on CPU",
    "NNODES=4 NODE_RANK=$i MASTER_ADDR=node0 ALIGN_RUN_DIR=/shared/runs/x launchers/torchrun.sh --nproc 8 "
    "parallel=fsdp ...": "four nodes of 8 GPUs sharing a run dir",
    "python -m align.train -m hydra/launcher=slurm hydra.launcher.nodes=4 hydra.launcher.partition=gpu "
    "parallel=fsdp ...": "a Slurm cluster; tests/integration/test_launchers.py renders its sbatch script",
    "python -m align.tools.supervise -- launchers/torchrun.sh --nproc 8 parallel=fsdp trainer.save_every=200 ...":
        "relaunches 8 GPU processes; tests/unit/control/test_supervisor.py holds the supervisor",
    "python -m align.train --config-dir ~/my-conf experiment=mine data=jsonl data.path=/data/chat.jsonl":
        "a user's config dir and data file; tests/config/test_user_config_dir.py runs --config-dir on one in tmp",
    "python -m align.train 'hydra.searchpath=[file:///home/me/my-conf]' experiment=mine":
        "a user's config dir; tests/config/test_user_config_dir.py runs hydra.searchpath on one in tmp",
}
"""Recipe (the command, without its comment) -> why it is not run here."""

SUBSTITUTED = {
    "outputs/<run_id>/export": "the export of the README's first training recipe (`python -m align.train`), run here",
    "outputs/<run_id>": "the run dir of that same run",
    "multirun/<sweep_id>": "the sweep dir of the README's `-m optimizer.lr=1e-4,3e-4` recipe, run here",
    "/ckpt/sft-export": "the export of the README's first training recipe, an SFT run",
    "/ckpt/Qwen2.5-0.5B-Instruct": "a tiny qwen2 checkpoint saved in tmp (tests/conftest.py tiny_hf_checkpoint)",
    "/ckpt/Mistral-7B-v0.3": "a tiny mistral checkpoint saved in tmp (tests/conftest.py tiny_hf_checkpoint)",
    "<tuned>": "the export of the README's `objective=dpo` recipe, run here",
    "<base>": "the export of the README's first training recipe",
    "p.jsonl": "two prompts written to tmp",
}
"""Placeholder of a run recipe -> what stands in for it."""

TRAIN_SIZE = ["trainer.max_steps=2", "data.max_records=16", "allow_dirty=true"]
"""Appended to every training run (the recipe's own values stay before them on the command line)."""

MODULES = {"align.preflight": "preflight"}
"""`python -m` modules that are not a command's own module in align/__main__.py."""


def recipe_lines(readme: str) -> list[str]:
    """The README's recipe commands, comments dropped: indented `python -m` lines of the "Recipes"
    section, indented `align ` lines of the Quick start, and every indented command of "Scale out"."""
    def section(title):
        return readme.split(f"\n## {title}", 1)[1].split("\n", 1)[1].split("\n## ", 1)[0]

    picks = [(section("Quick start"), "align "), (section("Recipes"), "python -m "), (section("Scale out"), "")]
    return [re.split(r"\s+#\s", ln.strip(), maxsplit=1)[0].strip() for text, start in picks
            for ln in text.splitlines()
            if ln.startswith("    ") and ln.strip().startswith(start) and not ln.strip().startswith("#")]


def readme_recipes() -> list[str]:
    return recipe_lines((REPO / "README.md").read_text())


def test_every_recipe_line_is_classified_and_every_entry_is_in_the_readme():
    recipes = readme_recipes()
    assert len(recipes) > 20  # the parse found the sections
    assert [r for r in SKIPPED if r not in recipes] == []  # no stale entry
    cannot_run = re.compile(r"<[a-z_]+>|/ckpt/|/data/|/shared/|--nproc|launchers/|hydra/launcher=|"
                            r"logger.mode=online|cuda")
    for r in recipes:
        if r in SKIPPED:
            continue
        rest = r
        for p in sorted(SUBSTITUTED, key=len, reverse=True):
            rest = rest.replace(p, "")
        assert not cannot_run.search(rest), f"README recipe neither run nor skipped: {r!r}"
        assert r.split()[0] in ("align", "python"), r
    for p in SUBSTITUTED:
        assert any(p in r for r in recipes if r not in SKIPPED), f"stale substitution {p!r}"


def test_recipe_lines_are_read_with_comments_dropped():
    text = ("# t\n\n## Quick start\n\n    align train a=1     # python -m align.train a=1\n    make train\n"
            "## Recipes\n\n    python -m align.eval x=<y> z=1   # what\n                      # a continuation\n"
            "## Scale out (more)\n\n    # a comment line\n    launchers/torchrun.sh --n 2 ...\n"
            "## Next\n\n    python -m align.train never\n")
    assert recipe_lines(text) == ["align train a=1", "python -m align.eval x=<y> z=1",
                                  "launchers/torchrun.sh --n 2 ..."]


def _argv(recipe: str) -> tuple[str, list[str]]:
    """(align command, its arguments) of a recipe line."""
    from align.__main__ import COMMANDS

    words = shlex.split(recipe)
    if words[0] == "align":
        return words[1], words[2:]
    assert words[:2] == ["python", "-m"], recipe
    by_module = {module: name for name, (module, _) in COMMANDS.items()} | MODULES
    return by_module[words[2]], words[3:]


def _additions(command: str, args: list[str], out: Path) -> list[str]:
    if command == "train":
        sweep = "-m" in args or "--multirun" in args
        logger = [] if any(a.startswith("logger=") for a in args) else ["logger=none"]
        where = f"hydra.sweep.dir={out}" if sweep else f"hydra.run.dir={out}"
        # a recipe that sets its length in epochs keeps it (max_steps beside it is refused): 16 records are short
        size = [a for a in TRAIN_SIZE if not a.startswith("trainer.max_steps=")] if any(
            a.startswith("trainer.epochs=") for a in args) else TRAIN_SIZE
        return [*size, *logger, where] + (["trainer.eval_every=2", "eval.limit=2", "eval.max_new_tokens=8"]
                                          if "eval=gsm8k" in args else [])
    if command == "eval":
        return ["eval.limit=2", "eval.max_new_tokens=8", "allow_dirty=true", f"hydra.run.dir={out}"]
    if command == "preflight":
        return ["allow_dirty=true"]
    if command in ("inspect", "probe"):
        return ["data.max_records=16"] + ([f"hydra.run.dir={out}"] if command == "probe" else [])
    return []


def _run(command: str, args: list[str], monkeypatch) -> int:
    from align.__main__ import main

    monkeypatch.setattr(sys, "argv", ["pytest"])
    try:
        code = main([command, *args])
    except SystemExit as e:
        code = e.code
    return code or 0


CHAINED = ("<run_id>", "<sweep_id>", "<tuned>", "<base>", "/ckpt/sft-export")
"""Placeholders filled by an earlier recipe's output: those recipes run last."""


@pytest.fixture
def process_state_kept():
    """The runs are in-process: whatever of os.environ they set (align.trainer's allocator setting,
    align.parallel.compile's cache dir) and the root logger's handlers Hydra's job logging adds go
    with the test."""
    saved, root = dict(os.environ), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    os.environ.clear()
    os.environ.update(saved)
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


@pytest.mark.slow
def test_readme_recipes_run_as_written(tmp_path, monkeypatch, process_state_kept):
    monkeypatch.chdir(tmp_path)  # `examples/rewards.py` and `p.jsonl` are relative: a copy / a file here
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "rewards.py").write_text((REPO / "examples" / "rewards.py").read_text())
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                                              ("How do I pick a lock?", "What is 2 + 3?")))
    subs = {"/ckpt/Qwen2.5-0.5B-Instruct": str(tiny_hf_checkpoint("qwen2", tmp_path / "qwen2")),
            "/ckpt/Mistral-7B-v0.3": str(tiny_hf_checkpoint("mistral", tmp_path / "mistral")),
            "p.jsonl": str(tmp_path / "p.jsonl")}
    recipes = [r for r in readme_recipes() if r not in SKIPPED]
    ordered = [r for r in recipes if not any(c in r for c in CHAINED)] + \
              [r for r in recipes if any(c in r for c in CHAINED)]
    failed = []
    for i, recipe in enumerate(ordered):
        command, args = _argv(recipe)
        for p in sorted(subs, key=len, reverse=True):
            args = [a.replace(p, subs[p]) for a in args]
        out = tmp_path / f"r{i}"
        code = _run(command, args + _additions(command, args, out), monkeypatch)
        if code != 0:
            failed.append(f"{recipe!r}: exit {code}")
            continue
        if command == "train":  # each job trained its steps and completed its manifest
            jobs = sorted(out.glob("*/provenance.json")) or [out / "provenance.json"]
            for m in jobs:
                manifest = json.loads(m.read_text())
                assert manifest["status"] == "complete", recipe
                rows = len((m.parent / "history.jsonl").read_text().splitlines())
                assert rows == manifest["run_length"]["max_steps"], recipe
                assert rows == 2 or "trainer.epochs=" in recipe, recipe
        if recipe == "python -m align.train":
            subs |= {"outputs/<run_id>/export": str(out / "export"), "outputs/<run_id>": str(out),
                     "/ckpt/sft-export": str(out / "export"), "<base>": str(out / "export")}
        elif recipe == "python -m align.train objective=dpo":
            subs["<tuned>"] = str(out / "export")
        elif "-m optimizer.lr=1e-4,3e-4" in recipe:
            subs["multirun/<sweep_id>"] = str(out)
    assert not failed, "\n".join(failed)
