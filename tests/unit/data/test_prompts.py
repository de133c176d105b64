"""RL prompt data (align/data/prompts.py) and the synthetic addition task (align/data/synthetic.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from align.config import to_typed
from align.data.prompts import build_prompt_stream, load_prompts
from align.data.sources import source_path
from align.data.synthetic import BUNDLED, add_records, bundled_add, render
from align.errors import ConfigError
from align.rewards import WeightedReward


def _cfg(compose, *overrides):
    return to_typed(compose(["objective=grpo", "logger=none", *overrides]))


def test_the_bundled_task_is_the_generators_output(tokenizer):
    for split, params in BUNDLED.items():
        assert bundled_add(split).read_text() == render(add_records(**params)), split
    recs = add_records(**BUNDLED["train"])
    assert all(int(r["answer"]) == sum(int(x) for x in r["question"].rstrip("=").split("+")) for r in recs)
    # every question and answer of the task is a short run of single tokens of the bundled tokenizer
    for r in recs[:50]:
        assert len(tokenizer(r["question"], add_special_tokens=False)["input_ids"]) == 4
        assert len(tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) == 1


def test_prompts_are_the_chat_up_to_the_assistant_turn_and_references_the_answers(compose, tokenizer):
    cfg = _cfg(compose, "data=gsm8k_prompts", "reward=gsm8k", "data.max_records=20")
    ps = load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))
    rows = [json.loads(line) for line in open(source_path(cfg.data))][:20]
    assert len(ps) == 20 and ps.references == [r["answer"] for r in rows]
    want = tokenizer.apply_chat_template([{"role": "user", "content": rows[3]["question"]}], tokenize=False,
                                   add_generation_prompt=True)
    assert ps.prompt(3) == tokenizer(want, add_special_tokens=False)["input_ids"]
    assert not ps.data.loss_mask.any()


def test_a_reference_the_reward_cannot_read_is_refused_naming_file_and_line(compose, tokenizer, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+1=", "reference": "2"}\n\n{"prompt": "2+2=", "reference": "four"}\n')
    cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}")
    with pytest.raises(ConfigError) as e:
        load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))
    assert str(e.value).startswith(f"{f}:3: exact_int reference is not an integer: 'four'"), str(e.value)


def test_long_prompts_are_dropped_or_refused_never_cut(compose, tokenizer, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+1=", "reference": "2"}\n{"prompt": "' + "1+" * 40 + '1=", "reference": "41"}\n')
    cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}", "data.max_seq_len=24")
    ps = load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))
    assert len(ps) == 1 and ps.data.stats["dropped_too_long"] == 1
    assert int(ps.data.lengths.max()) <= 24 - cfg.objective.max_new_tokens
    cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}", "data.max_seq_len=24", "data.truncation=fail")
    with pytest.raises(ConfigError, match=f"^{f}:2: prompt has"):
        load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))


def test_the_fingerprint_covers_the_references(compose, tokenizer, tmp_path):
    from align.data.encode import dataset_fingerprint

    prints = []
    for ref in ("2", "3"):
        f = tmp_path / f"p{ref}.jsonl"
        f.write_text(f'{{"prompt": "1+1=", "reference": "{ref}"}}\n{{"prompt": "1+2=", "reference": "3"}}\n')
        cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}")
        prints.append(dataset_fingerprint(load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights)).data))
    assert prints[0] != prints[1]


def test_the_prompt_stream_serves_whole_rollouts_and_resumes_at_the_next(compose, tokenizer):
    cfg = _cfg(compose, "objective.prompts_per_rollout=6", "data.max_records=40")
    ps = load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))
    stream = build_prompt_stream(cfg, ps, tokenizer.pad_token_id)
    it = iter(stream)
    first = [next(it).rows.tolist() for _ in range(8)]  # past an epoch of 40 // 6 = 6 rollouts
    assert all(len(r) == 6 for r in first)
    assert len({x for r in first[:6] for x in r}) == 36  # an epoch never repeats a prompt
    state = stream.state_dict()
    again = build_prompt_stream(cfg, ps, tokenizer.pad_token_id)
    again.load_state_dict(state)
    assert next(iter(again)).rows.tolist() == next(it).rows.tolist()
    assert np.all(ps.data.lengths > 0)


def test_too_few_prompts_for_a_rollout_on_every_rank_is_refused(compose, tokenizer):
    cfg = _cfg(compose, "objective.prompts_per_rollout=16", "data.max_records=10")
    ps = load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))
    with pytest.raises(ConfigError, match="^objective.prompts_per_rollout: the data holds 10 prompts"):
        build_prompt_stream(cfg, ps, tokenizer.pad_token_id)


def test_the_plan_and_the_objective_share_one_read_of_the_prompts_until_the_file_changes(compose, tokenizer, tmp_path):
    """The memory plan reads the prompts before the objective does (align/plan/budget_auto.py): the same
    inputs give the same set, read once; a changed file is read again."""
    from align.data.prompts import longest_prompt

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+1=", "reference": "2"}\n')
    cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}")
    reward = WeightedReward(cfg.reward.weights)
    first = load_prompts(cfg, tokenizer, reward)
    assert load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights)) is first
    assert longest_prompt(cfg) == (int(first.data.lengths.max()), 1)
    f.write_text('{"prompt": "1+1=", "reference": "2"}\n{"prompt": "' + "1+" * 9 + '1=", "reference": "10"}\n')
    again = load_prompts(cfg, tokenizer, reward)
    assert again is not first and len(again) == 2 and longest_prompt(cfg)[0] > int(first.data.lengths.max())


def _python(name: str) -> WeightedReward:
    return WeightedReward({"python": 1.0}, function=f"tests.python_rewards:{name}")


def test_under_a_python_reward_each_prompt_keeps_its_records_fields_and_the_fingerprint_covers_them(
        compose, tokenizer, tmp_path):
    from align.data.encode import dataset_fingerprint

    prints = []
    for judge in ("strict", "lenient"):
        f = tmp_path / f"{judge}.jsonl"
        f.write_text(f'{{"prompt": "1+1=", "reference": "2", "judge": "{judge}"}}\n'
                     '{"prompt": "1+2=", "reference": "3", "judge": "strict"}\n')
        cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}")
        ps = load_prompts(cfg, tokenizer, _python("needs_a_field"))
        assert ps.columns[0] == {"prompt": "1+1=", "reference": "2", "judge": judge} and ps.wheres[1] == f"{f}:2"
        assert ps.texts[1] == tokenizer.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=False,
                                                      add_generation_prompt=True)
        prints.append(dataset_fingerprint(ps.data))
    assert prints[0] != prints[1]  # a field the function reads is part of the data
    plain = load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))
    assert plain.columns == [{}, {}]  # no python reward: nothing kept


@pytest.mark.parametrize("line, says", [
    ('{"prompt": "1+1=", "reference": "2"}', "reward.function tests.python_rewards:needs_a_field requires the "
                                             "field 'judge', which this record lacks (its fields: prompt, reference)"),
    ('{"prompt": "1+1=", "reference": "2", "judge": "x", "completions": 3}',
     "field 'completions' would collide with the reward function's own argument"),
])
def test_a_record_that_does_not_fit_the_functions_call_is_refused_naming_its_line(compose, tokenizer, tmp_path, line,
                                                                                  says):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+2=", "reference": "3", "judge": "x"}\n' + line + "\n")
    cfg = _cfg(compose, "data=jsonl_prompts", f"data.path={f}")
    with pytest.raises(ConfigError) as e:
        load_prompts(cfg, tokenizer, _python("needs_a_field"))
    assert str(e.value).startswith(f"{f}:2: {says}") and "\n" not in str(e.value), str(e.value)
