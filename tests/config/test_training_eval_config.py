"""The in-training eval's keys (`eval=<option>`, `trainer.eval_every`, `eval_generation`): what composes,
and each refusal as one line with exit 2, before anything is built."""

from __future__ import annotations

import pytest

from align.run.cli import validate_command_line
from tests.config.test_schema_checks import _refused

ON = ["eval=gsm8k", "trainer.eval_every=5"]


def test_the_eval_group_composes_from_the_same_files_as_align_eval(compose):
    from align.config import EvalConfig, to_typed
    from align.evaluation.config import EvalConfig as FromEvaluation

    assert EvalConfig is FromEvaluation  # one schema; the old import path still works
    typed = to_typed(compose([*ON, "eval.limit=8", "eval_generation.batch_size=16"]))
    assert isinstance(typed.eval, EvalConfig) and typed.eval.limit == 8 and typed.eval.max_new_tokens == 512
    assert typed.trainer.eval_every == 5 and typed.eval_generation.batch_size == 16
    assert to_typed(compose([])).eval is None


@pytest.mark.parametrize("overrides,key,says", [
    (["trainer.eval_every=3"], "trainer.eval_every", "needs an eval"),
    (["eval=gsm8k"], "eval", "trainer.eval_every > 0"),
    (["trainer.eval_every=-1"], "trainer.eval_every", "must be >= 0"),
    ([*ON, "eval.oracle=true"], "eval.oracle", "python -m align.eval"),
    ([*ON, "eval.compare_to=/x"], "eval.compare_to", "no second model"),
    ([*ON, "eval.cache=false"], "eval.cache", "change every call"),
    ([*ON, "eval.cache_dir=/tmp/c"], "eval.cache_dir", "nothing is cached"),
    ([*ON, "eval_generation.lockstep=true"], "eval_generation.lockstep", "set by the trainer"),
    (["eval_generation.batch_size=8"], "eval_generation.batch_size", "in-training eval"),
    ([*ON, "eval.nope=1"], "eval.nope", "unknown key in eval"),
    ([*ON, "eval.samples=0"], "eval.samples", "must be >= 1"),
])
def test_a_bad_eval_key_is_one_line(capsys, overrides, key, says):
    line = _refused(capsys, *overrides)
    assert line.startswith(f"{key}: ") and says in line, line


def test_a_key_of_an_eval_that_is_not_composed_says_to_compose_it(capsys):
    line = _refused(capsys, "eval.limit=3")
    assert "eval=gsm8k" in line and "not composed" in line, line


def test_a_good_eval_passes_validation():
    assert validate_command_line([*ON, "eval.limit=4", "allow_dirty=true"])[0].eval.limit == 4


def test_missing_eval_records_are_refused_by_preflight_before_any_load(tmp_path):
    from align.config import to_typed
    from align.errors import ConfigError
    from align.run.cli import compose
    from align.run.preflight_checks import run_preflight

    cfg = to_typed(compose([*ON, "eval=refusal", f"eval.prompts={tmp_path / 'none.jsonl'}", "allow_dirty=true"]))
    with pytest.raises(ConfigError) as e:
        run_preflight(cfg)
    assert str(e.value).startswith("eval.prompts: ") and "none.jsonl" in str(e.value), str(e.value)
