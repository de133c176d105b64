"""Model FLOPs per token, the measured ceiling, MFU, and throughput in every training run."""

from __future__ import annotations

import math

import pytest
import torch

from align.config import to_typed
from align.telemetry.throughput import CONVENTION, Ceiling, ModelFlops, Throughput, measure_matmul_ceiling, rates


def _model(compose, *overrides):
    from tests.conftest import build_tiny

    cfg = to_typed(compose(list(overrides)))
    return build_tiny(cfg.model, cfg.attention).model


def test_dense_model_is_6N_plus_attention(compose):
    m = _model(compose, "model=mistral")
    c = m.config
    d, inter, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    hd = d // c.num_attention_heads
    kv = c.num_key_value_heads * hd
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * inter  # q, k, v, o, gate/up/down
    n = L * per_layer + V * d  # + LM head; the input embedding is a lookup, norms are not matmuls
    f = ModelFlops.from_model(m)
    assert f.params_active == n
    assert f.params_embedding == V * d
    assert f.params_total == sum(p.numel() for p in m.parameters())
    assert f.per_token(512) == 6 * n + 12 * L * d * 512
    assert f.per_batch(8, 512) == 8 * 512 * f.per_token(512)


def test_moe_counts_only_the_active_experts(compose):
    m = _model(compose, "model=olmoe")
    c = m.config
    f = ModelFlops.from_model(m)
    expert = sum(p.numel() for n, p in m.named_parameters() if ".experts." in n)
    dense = sum(p.numel() for n, p in m.named_parameters()
                if p.dim() >= 2 and ".experts." not in n and "embed_tokens" not in n)
    assert f.params_expert == expert > 0
    assert f.experts_active_fraction == c.num_experts_per_tok / c.num_experts
    assert f.params_active == int(dense + expert * c.num_experts_per_tok / c.num_experts)


def test_frozen_weights_skip_only_their_weight_gradient(compose):
    m = _model(compose, "model=mistral")
    full = ModelFlops.from_model(m)
    for n, p in m.named_parameters():
        p.requires_grad_("lm_head" in n)
    f = ModelFlops.from_model(m)
    head = m.lm_head.weight.numel()
    assert f.params_active_trainable == head
    assert f.per_token(64) == 4 * full.params_active + 2 * head + 12 * sum(a.d_attn * 64 for a in f.attention)


def test_a_lora_model_keeps_its_attention_layers_in_the_count(compose):
    """PEFT wraps q_proj in a LoRA layer that is no nn.Linear: the attention term must still see it."""
    from align.models.lora import apply_lora

    cfg = to_typed(compose(["model=mistral", "model.lora.enabled=true"]))
    base = ModelFlops.from_model(_model(compose, "model=mistral"))
    lora, _ = apply_lora(_model(compose, "model=mistral"), cfg.model)
    assert ModelFlops.from_model(lora).attention == base.attention and base.attention


def test_sliding_layers_attend_over_their_window_only(compose):
    m = _model(compose, "model=gemma4")
    f = ModelFlops.from_model(m)
    windows = [a.window for a in f.attention]
    assert windows.count(None) == 1 and set(windows) - {None} == {32}  # tiny preset: 3 sliding, 1 full
    attn = lambda w: f.per_token(w) - f.per_token(0)  # noqa: E731
    assert attn(32) == 12 * 32 * sum(a.d_attn for a in f.attention)
    full = [a for a in f.attention if a.window is None][0]
    assert attn(64) - attn(32) == 12 * 32 * full.d_attn  # past the window only the full layer grows


def test_cpu_ceiling_is_small_labelled_measured_once_and_not_trusted_for_mfu():
    c = measure_matmul_ceiling(torch.device("cpu"))
    assert c.tflops > 0 and math.isfinite(c.tflops)
    assert "float32 512^3" in c.label and "not a performance figure" in c.label
    assert c.untrusted and "no trustworthy matmul ceiling" in c.untrusted
    assert measure_matmul_ceiling(torch.device("cpu")) is c


GPU = Ceiling(tflops=4.0, label="bf16 8192^3", device_name="gpu")


def test_rates_and_mfu_against_both_denominators():
    r = rates(tokens=1000, real_tokens=800, loss_tokens=300, flops=2e12, seconds=2.0, ceiling=GPU, datasheet=10.0)
    assert (r["tokens_per_s"], r["real_tokens_per_s"], r["loss_tokens_per_s"]) == (500, 400, 150)
    assert r["flops_per_token"] == 2e9
    assert r["achieved_tflops"] == pytest.approx(1.0)
    assert r["mfu_measured"] == pytest.approx(0.25) and r["mfu_datasheet"] == pytest.approx(0.1)
    assert r["mfu_measured_reason"] is None and r["mfu_datasheet_reason"] is None
    r = rates(1000, 800, 300, 2e12, 2.0, None, None)
    assert r["mfu_measured"] is None and r["mfu_datasheet"] is None  # present and null
    assert "no ceiling measured" in r["mfu_measured_reason"] and "no datasheet" in r["mfu_datasheet_reason"]


def test_an_mfu_above_one_is_never_reported_and_says_why():
    """The CPU scaling probe printed "MFU 198.85%": a utilisation past its denominator is a wrong
    denominator or FLOP count, whichever device computed it."""
    r = rates(1000, 1000, 1000, flops=2e13, seconds=1.0, ceiling=GPU, datasheet=10.0)  # 20 TFLOP/s achieved
    assert r["achieved_tflops"] == pytest.approx(20.0)
    assert r["mfu_measured"] is None and "500%" in r["mfu_measured_reason"] and "impossible" in r["mfu_measured_reason"]
    assert r["mfu_datasheet"] is None and "200%" in r["mfu_datasheet_reason"]
    at_peak = rates(1000, 1000, 1000, flops=4e12, seconds=1.0, ceiling=GPU, datasheet=None)
    assert at_peak["mfu_measured"] == pytest.approx(1.0)


def test_an_untrusted_ceiling_gives_no_mfu_whatever_the_ratio():
    cpu = Ceiling(tflops=4.0, label="cpu float32 512^3", device_name="cpu", untrusted="cpu: no trustworthy ceiling")
    r = rates(1000, 1000, 1000, flops=1e12, seconds=1.0, ceiling=cpu, datasheet=None)  # 25% would be plausible
    assert r["mfu_measured"] is None and r["mfu_measured_reason"] == "cpu: no trustworthy ceiling"


class _B:
    def __init__(self, rows, width, real, loss):
        self.input_ids = torch.zeros(rows, width)
        self.tokens, self.real_tokens, self.loss_tokens = rows * width, real, loss


def test_summary_leaves_out_the_warm_up_step_and_keeps_every_key(compose):
    tp = Throughput(ModelFlops.from_model(_model(compose, "model=mistral")), None, None, None)
    empty = tp.summary()
    assert empty["throughput/tokens_per_s"] is None and empty["throughput/flops_convention"] == CONVENTION
    first = tp.step([_B(2, 64, 100, 50)], seconds=10.0)  # slow first step: excluded
    tp.step([_B(2, 64, 100, 50), _B(2, 32, 60, 20)], seconds=1.0)
    s = tp.summary()
    assert s["throughput/steps_counted"] == 1
    assert s["throughput/tokens_per_s"] == pytest.approx(2 * 64 + 2 * 32)
    assert s["throughput/loss_tokens_per_s"] == pytest.approx(70)
    expected_flops = tp.flops.per_batch(2, 64) + tp.flops.per_batch(2, 32)
    assert s["throughput/achieved_tflops"] == pytest.approx(expected_flops / 1e12)
    assert first["model_flops"] == tp.flops.per_batch(2, 64)
    for k in ("throughput/mfu_measured", "throughput/mfu_datasheet", "throughput/ceiling_tflops",
              "throughput/datasheet_tflops", "throughput/datasheet_source"):
        assert k in s and s[k] is None


def test_every_training_step_reports_throughput(compose, tmp_path):
    from align.trainer import Trainer

    cfg = to_typed(compose(["logger=none", "data.max_records=32", "sampler=shuffle", "sampler.micro_batch_size=4",
                            "trainer.max_steps=3",
                            "trainer.export=false"]))
    trainer = Trainer.build(cfg, tmp_path)
    assert trainer.fit() == 0
    from align.telemetry.history import read_history

    rows = read_history(tmp_path / "history.jsonl")
    for key in ("tokens_per_s", "real_tokens_per_s", "loss_tokens_per_s", "flops_per_token", "achieved_tflops",
                "mfu_measured", "mfu_datasheet", "model_flops", "compile_s"):
        assert key in rows[-1], key
    assert rows[0]["compile_s"] == 0.0  # nothing compiles on a CPU run: the bench reads it from here
    r = rows[-1]
    assert r["loss_tokens_per_s"] == pytest.approx(r["loss_tokens"] / r["step_time_s"])
    assert r["mfu_measured"] is None and r["mfu_datasheet"] is None  # CPU: no trustworthy ceiling, no datasheet
    assert not any(k.endswith("_reason") for k in r)  # history rows stay numeric
    s = trainer.summary()
    assert s["throughput/steps_counted"] == 2
    assert s["throughput/flops_convention"] == CONVENTION
    assert "cpu" in s["throughput/ceiling_label"]
    assert s["throughput/mfu_measured"] is None
    assert "no trustworthy matmul ceiling" in s["throughput/mfu_measured_reason"]


def test_a_packed_batch_counts_attention_per_document(compose):
    from align.telemetry.throughput import document_lengths

    tp = Throughput(ModelFlops.from_model(_model(compose, "model=mistral")), None, None, None)
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]])
    assert document_lengths(pos) == [3, 2, 5]

    class Packed(_B):
        position_ids = pos

    packed = Packed(1, 10, 10, 5)
    assert tp.batch_flops([packed]) == tp.flops.per_batch(1, 3) + tp.flops.per_batch(1, 2) + tp.flops.per_batch(1, 5)
    assert tp.batch_flops([packed]) < tp.batch_flops([_B(1, 10, 10, 5)])  # not the full 10x10 square


def test_step_time_runs_boundary_to_boundary_so_nothing_between_steps_goes_unaccounted(tmp_path):
    """On a GPU the optimizer's kernels run after the host has left train_step; a step time measured
    from the step's own start missed them (an MoE step read 15% fast). Here host work between steps
    (a slow log call) stands in for them: the step times must add up to the wall between boundaries."""
    import json
    import time

    from tests.conftest import build_trainer

    t = build_trainer(tmp_path, "trainer.max_steps=5", "trainer.log_every=100")
    log = t.log

    def slow_log(metrics):
        log(metrics)
        time.sleep(0.05)

    t.log = slow_log
    assert t.fit() == 0
    rows = [json.loads(x) for x in (t.run_dir / "history.jsonl").read_text().splitlines()]
    later = rows[1:]
    assert sum(r["step_time_s"] for r in later) >= 0.05 * len(later)  # each holds one slow log call
    wall = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    assert abs(sum(r["step_time_s"] for r in later) - wall) < 0.1 * wall
