"""`python -m align.tools.inspect`: one encoded record as the run with the same overrides trains on it,
the tokens in the loss marked."""

from __future__ import annotations

import re

import pytest

from align.config import to_typed
from align.run.cli import compose
from align.tools import inspect as align_inspect
from tests.conftest import run_cli


def _encoded(*overrides):
    from align.data.cache import load_dataset
    from align.data.tokenizer import load_tokenizer

    cfg = to_typed(compose(list(overrides)))
    tok = load_tokenizer(cfg.model)
    return tok, load_dataset(cfg.data, cfg.model, tok)


def test_the_marked_text_is_the_records_loss_tokens_and_follows_the_overrides(tmp_path, capsys):
    ov = [f"data.cache_dir={tmp_path / 'cache'}", "data.max_records=40", "data.max_seq_len=48",
          "data.truncation=truncate"]
    assert align_inspect.main([*ov, "index=2", "tokens=true"]) == 0
    out = capsys.readouterr().out
    tok, data = _encoded(*ov)
    ids, mask = (a.tolist() for a in data.row(2))
    assert len(ids) == 48  # the data group's override reached the encode: the run's record, not a default
    assert out.startswith(f"record 2 of {len(data)} (id {data.ids[2]}")
    assert f"48 tokens, {sum(mask)} in the loss" in out
    body = out.split("-" * 100)[1]  # the record between the two rules
    in_loss = re.findall(r"\[\[(.*?)\]\]", body, re.S)
    expected = [tok.decode(run) for m, run in align_inspect.segments(ids, mask) if m]
    assert in_loss == expected and in_loss  # every loss run, and only those, between the marks
    context = re.sub(r"\[\[.*?\]\]", "", body, flags=re.S).strip()
    assert context == "".join(tok.decode(run) for m, run in align_inspect.segments(ids, mask) if not m).strip()
    rows = [ln for ln in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+(yes|-)\s", ln)]
    assert [int(r.split()[1]) for r in rows] == ids and [("yes" in r.split()[2]) for r in rows] == mask


def test_the_cli_runs_from_the_same_config_groups_as_train(tmp_path):
    p = run_cli("align.tools.inspect", "model=olmoe", f"data.cache_dir={tmp_path / 'cache'}", "data.max_records=8",
                "index=0")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("record 0 of ") and "[[" in p.stdout and "]]" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["index=-1"], "index=-1: not a record index"),
    (["tokens=maybe"], "tokens=maybe: accepted: true, false"),
    (["-m", "data.max_seq_len=64,128"], "-m: align.tools.inspect shows the data of one run"),
    (["data.no_such_key=1"], "data.no_such_key"),
    (["index=8"], "index=8: the encoded data set has 8 records; accepted: 0..7"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        align_inspect.main([f"data.cache_dir={tmp_path / 'cache'}", "data.max_records=8", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("align: error: ") and message in err[0]
