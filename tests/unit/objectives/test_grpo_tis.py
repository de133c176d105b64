"""`objective.is_correction=tis`: the weight the objective APPLIES to each token's loss, intercepted where
it hands it to the policy loss during a real training step of the tiny model, against

- a hand computation, min(exp(trainer logp - sampled logp), is_cap), where the trainer's log-probs are
  forwarded here, each completion alone, by the model as it was before the step (never through the
  objective's code), and the sampled log-probs are the engine's record of the distribution it drew
  from (after top-p; at top_p=1 that is the engine's log-prob itself);
- TRL 1.16's own formula: the block of `GRPOTrainer._generate_and_score_completions` that computes
  `vllm_importance_sampling_ratio` from `old_per_token_logps` and `sampling_per_token_logps` (vLLM's
  processed log-probs, i.e. after top-p), read from the installed source and run on the same tensors
  in its `token_truncate` mode with `vllm_importance_sampling_clip_max` = is_cap and no lower clip,
  the mode `tis` is.

The engine/trainer gap is planted: the engine generates with a bf16 copy while the trainer computes
in fp32, so the weights are not all 1 and the cap truncates some of them."""

from __future__ import annotations

import copy
import inspect
import math
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import align.objectives.grpo as grpo_module
from tests.conftest import build_trainer
from tests.grpo_rewards import LengthParity

CAP = 1.0
TIS = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.max_steps=1",
       "trainer.export=false", "trainer.device=cpu", "trainer.grad_accum=2", "objective.generation_dtype=bf16",
       "objective.is_correction=tis", f"objective.is_cap={CAP}"]


def _trl_ratio(old: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """TRL's truncated importance-sampling ratio [B, T], computed by TRL's own source lines."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = src.find("# Compute the importance sampling ratio when using vLLM")
    end = src.find("# Compute the per-token log probabilities for the reference model", start)
    if start < 0 or end < 0:
        pytest.fail("TRL's GRPOTrainer no longer computes vllm_importance_sampling_ratio where this test reads it")
    block = textwrap.dedent(src[src.rfind("\n", 0, start) + 1:end])
    trl_self = SimpleNamespace(use_vllm=True, vllm_importance_sampling_correction=True,
                               vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=None,
                               vllm_importance_sampling_clip_max=cap)
    scope = {"torch": torch, "math": math, "self": trl_self, "old_per_token_logps": old,
             "sampling_per_token_logps": sampled, "completion_mask": mask, "tool_mask": None}
    exec(compile(block, "trl.GRPOTrainer._generate_and_score_completions", "exec"), scope)
    return scope["vllm_importance_sampling_ratio"]


def _alone_logps(model: torch.nn.Module, r, s: int, temperature: float) -> torch.Tensor:
    """Completion s's tokens' log softmax(logits / T) under `model`, the sequence forwarded alone (fp64)."""
    tokens = torch.from_numpy(r.tokens[r.offsets[s]:r.offsets[s + 1]].astype(np.int64))
    p = int(r.prompt_lens[s])
    with torch.no_grad():
        logits = model(input_ids=tokens[None]).logits[0].double()
    logp = torch.log_softmax(logits[p - 1:-1] / temperature, dim=-1)
    return logp.gather(1, tokens[p:, None])[:, 0]


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_applied_tis_weight_is_the_truncated_ratio_and_trls(tmp_path, monkeypatch, top_p):
    trainer = build_trainer(tmp_path, *TIS, f"objective.top_p={top_p}")
    obj = trainer.objective
    obj.reward = LengthParity()
    before = copy.deepcopy(trainer.model).eval()  # the weights that generated the rollout and score it first
    applied: list[torch.Tensor] = []
    real = grpo_module.policy_loss

    def intercept(*args, **kwargs):
        applied.append(kwargs["is_weight"].detach().double().cpu())
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo_module, "policy_loss", intercept)
    trainer.train_step(iter(trainer.stream))
    r = obj.rollout
    micro = r.parts[0]
    assert len(applied) == len(micro) == 2  # one weight per micro-batch the step trained on

    coff = r.completion_offsets()
    for weight, seqs in zip(applied, micro):
        trainer_lp = [_alone_logps(before, r, int(s), obj.cfg.temperature) for s in seqs]
        sampled = [torch.from_numpy(r.sampler_logps[coff[s]:coff[s + 1]]).double() for s in seqs]
        if top_p == 1.0:  # nothing truncated the distribution: sampled = the engine's log-prob
            assert all(np.array_equal(r.sampler_logps[coff[s]:coff[s + 1]], r.engine_logps[coff[s]:coff[s + 1]])
                       for s in seqs)
        else:  # top-p renormalised what was drawn: the weight must be against that, not the full softmax
            assert not np.allclose(r.sampler_logps, r.engine_logps)
        t, e = torch.cat(trainer_lp), torch.cat(sampled)
        ratio = torch.exp(t - e)
        hand = torch.tensor([min(math.exp(a - b), CAP) for a, b in zip(t.tolist(), e.tolist())], dtype=torch.float64)
        torch.testing.assert_close(weight, hand, rtol=0, atol=1e-5)

        width = max(len(x) for x in trainer_lp)
        pad = torch.zeros(len(seqs), width, dtype=torch.float64)
        old, samp, mask = pad.clone(), pad.clone(), torch.zeros(len(seqs), width, dtype=torch.long)
        for i, (a, b) in enumerate(zip(trainer_lp, sampled)):
            old[i, :len(a)], samp[i, :len(b)], mask[i, :len(a)] = a, b, 1
        trl = _trl_ratio(old, samp, mask, CAP)[mask.bool()]  # row by row: the objective's flattened order
        torch.testing.assert_close(trl, hand, rtol=0, atol=1e-12)
        torch.testing.assert_close(weight, trl, rtol=0, atol=1e-5)
        if top_p == 1.0:  # the planted bf16 gap puts tokens on both sides of the cap: both branches are checked
            assert (ratio > CAP + 1e-3).any() and (ratio < CAP - 1e-3).any(), ratio
