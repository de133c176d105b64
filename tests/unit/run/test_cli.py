"""The command line read as Hydra reads it, each job's preflight run once (before Hydra) and reused
by the job, and sweeps expanded as Hydra's basic sweeper expands them."""

from __future__ import annotations

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference, in the test only
from hydra.core.override_parser.overrides_parser import OverridesParser

from align.run import cli


def test_flags_and_overrides_are_told_apart():
    args = cli.parse_command_line(["-m", "--config-path", "/x", "-cn=c", "a=1", "b=2,3"])
    assert args.multirun and args.config_path == "/x" and args.config_name == "c" and args.overrides == ["a=1", "b=2,3"]


@pytest.mark.parametrize("overrides", [
    ["optimizer.lr=1e-4,3e-4", "trainer.max_steps=3"],
    ["sampler.bucket_size=range(2,5)", "+trainer.x=1", "model=olmoe", "data.x='a,b'"],
    ["optimizer.lr=1e-4", "optimizer.lr=1e-3,1e-2"],
])
def test_sweeps_expand_to_the_basic_sweepers_jobs(overrides):
    jobs, multirun = cli.job_override_lists(["-m", *overrides])
    [want] = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    assert multirun and jobs == want


def test_each_job_is_preflighted_once(monkeypatch):
    import align.run.preflight_checks as preflight

    calls = []
    real = preflight.run_preflight
    monkeypatch.setattr(preflight, "run_preflight", lambda cfg, root=None: calls.append(cfg) or real(cfg, root))
    argv = ["-m", "optimizer.lr=1e-4,3e-4", "allow_dirty=true", "logger=none"]
    cli.preflight_command_line(argv)
    assert len(calls) == 2
    for job in cli.job_override_lists(argv)[0]:  # what each Hydra job's task overrides are
        assert cli.job_preflight(calls[0], job) is not None
    assert len(calls) == 2, "a job ran its preflight again"
    cli.job_preflight(calls[0], ["allow_dirty=true", "logger=none"])  # a job the pass did not see
    assert len(calls) == 3


@pytest.mark.parametrize("path", ["/tmp/my data (1)/x.jsonl", "/tmp/it's mine/x.jsonl", "/tmp/a[1] b=c.jsonl"])
def test_a_value_the_grammar_cannot_read_bare_is_one_line_that_says_how_to_quote_it(capsys, path):
    """The hint is a shell word that, passed as given, composes to the path meant."""
    import shlex

    from align.config import to_typed

    with pytest.raises(SystemExit) as e:
        cli.validate_command_line(["data=jsonl", f"data.path={path}"])
    [line] = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and line.startswith(f"align: error: cannot parse override {f'data.path={path}'!r}: ")
    [quoted] = shlex.split(line.split("quote it: ", 1)[1])
    assert to_typed(cli.compose(["data=jsonl", quoted])).data.path == path


def test_the_rest_of_a_value_the_shell_split_says_to_quote_the_whole_override(capsys):
    with pytest.raises(SystemExit):
        cli.validate_command_line(["data=jsonl", "data.path=/tmp/my", "data/x.jsonl"])
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("align: error: cannot parse override 'data/x.jsonl': ") and "not key=value" in line
    assert "quote the whole override, e.g. 'data.path=\"/tmp/my data/x.jsonl\"'" in line
