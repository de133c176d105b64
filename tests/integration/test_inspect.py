"""`python -m align.tools.inspect`: one encoded record as the run with the same overrides trains on it,
the tokens in the loss marked."""

from __future__ import annotations

import re

import pytest

from align.config import to_typed
from align.run.cli import compose
from align.tools import inspect as align_inspect
from tests.conftest import bundled_tokenizer, run_cli


def _encoded(*overrides):
    from align.data.encode_cache import load_dataset

    cfg = to_typed(compose(list(overrides)))
    tok = bundled_tokenizer()
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
    (["objective=dpo", "index=8"], "index=8: the encoded data set has 8 pairs; accepted: 0..7"),
    (["objective=grpo", "index=8"], "index=8: the prompt set has 8 prompts; accepted: 0..7"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        align_inspect.main([f"data.cache_dir={tmp_path / 'cache'}", "data.max_records=8", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("align: error: ") and message in err[0]


def _sections(out: str) -> list[str]:
    return out.split("-" * 100)


def _inspected(tmp_path, capsys, objective: str, index: int):
    """(what inspect printed for item `index` with its token table, the run's typed config, its tokenizer)."""
    ov = [f"objective={objective}", f"data.cache_dir={tmp_path / 'cache'}", "data.max_records=8"]
    assert align_inspect.main([*ov, f"index={index}", "tokens=true"]) == 0
    cfg = to_typed(compose(ov))
    return capsys.readouterr().out, cfg, bundled_tokenizer()


def test_dpo_shows_both_sides_of_the_pair_with_the_loss_marks_over_their_completions(tmp_path, capsys):
    from align.data.preference import load_pairs

    out, cfg, tok = _inspected(tmp_path, capsys, "dpo", 1)
    pairs = load_pairs(cfg, tok)
    assert out.startswith(f"pair 1 of {pairs.pairs} (id {pairs.pair_ids[1]}")
    head, chosen, chosen_tokens, rejected, rejected_tokens = _sections(out)
    assert head.rstrip().endswith("chosen (sequence 2 of the encoded pairs)")
    assert chosen_tokens.rstrip().endswith("rejected (sequence 3 of the encoded pairs)")
    texts = []
    for seq, body, table in ((2, chosen, chosen_tokens), (3, rejected, rejected_tokens)):
        ids, mask = (a.tolist() for a in pairs.row(seq))
        runs = align_inspect.segments(ids, mask)
        # one run of context (the shared prompt) then one of loss tokens (the completion and its EOS)
        assert [m for m, _ in runs] == [False, True]
        assert re.findall(r"\[\[(.*?)\]\]", body, re.S) == [tok.decode(runs[1][1])]
        assert re.sub(r"\[\[.*?\]\]", "", body, flags=re.S).strip() == tok.decode(runs[0][1]).strip()
        rows = [ln for ln in table.splitlines() if re.match(r"^\s+\d+\s+\d+\s+(yes|-)\s", ln)]
        assert [int(r.split()[1]) for r in rows] == ids and [("yes" in r.split()[2]) for r in rows] == mask
        texts.append(tok.decode(runs[1][1]))
    assert texts[0] != texts[1]  # two sides, not one shown twice


def test_grpo_shows_the_prompt_it_generates_from_and_no_answer_in_the_loss(tmp_path, capsys):
    from align.data.prompts import load_prompts
    from align.rewards import WeightedReward

    out, cfg, tok = _inspected(tmp_path, capsys, "grpo", 2)
    prompts = load_prompts(cfg, tok, WeightedReward(cfg.reward.weights))
    ids, reference = prompts.prompt(2), prompts.references[2]
    head, body, rest = _sections(out)
    assert body.strip() == tok.decode(ids).strip()  # the prompt as generation receives it, nothing after it
    assert tok.decode(ids).endswith("<|assistant|>")  # ... the chat template's generation prompt
    assert "[[" not in body and reference not in body
    rows = [ln for ln in rest.splitlines() if re.match(r"^\s+\d+\s+\d+\s+(yes|-)\s", ln)]
    assert [int(r.split()[1]) for r in rows] == ids and not any("yes" in r.split()[2] for r in rows)
    assert f"{len(ids)} tokens, none in the loss" in head
    assert "scored by reward.weights {'exact_int': 1.0}" in rest
    assert rest.rstrip().splitlines()[-1] == (f"reference answer, given to the verifier (exact_int), never trained on: "
                                             f"{reference!r}")


def test_grpo_under_a_python_reward_names_the_function_and_the_fields_it_gets(tmp_path, capsys):
    ov = ["objective=grpo", "reward=python", "reward.function=tests.python_rewards:recorded", "data.max_records=8"]
    assert align_inspect.main([*ov, "index=2"]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last == ("python: reward.function tests.python_rewards:recorded gets this prompt's completions with its "
                    "rendered text and its record's fields as keywords (answer, question)"), last
