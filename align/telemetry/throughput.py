"""Throughput and MFU, with the counting convention written down next to the number.

MFU invites a fight about what counts as a FLOP, so every run reports the decomposition beside it:
tokens/s, real (unpadded) tokens/s, loss tokens/s, model FLOPs per token WITH its convention, achieved
TFLOP/s, and MFU against two denominators: a bf16 matmul ceiling measured on the same device at
start-up, and the vendor datasheet.

An MFU is reported only against a denominator that bounds what the device can do: a CUDA device's
measured bf16 GEMM rate or its datasheet figure. A CPU has neither (the small fp32 matmul measured
there is beaten by the model's own bigger matmuls, which read as "198%"), so on a CPU MFU is null
with the reason beside it. A value above 1 is never reported: it says the denominator or the FLOP
count is wrong, not that the run beat the hardware; it becomes null with that reason.

Counting convention (`CONVENTION`), per token of a micro-batch of padded width w:

    model FLOPs/token = 4*N_active + 2*N_active_trainable + 12 * sum_layers(d_attn * ctx(w))

* N_active: parameters used in a matmul for this token: every parameter with >= 2 dims except
  input-embedding lookup tables (the LM head counts); MoE expert weights scaled by top_k/num_experts.
  For full fine-tuning this is the familiar 6N (2N forward, 2N input-gradient, 2N weight-gradient);
  a frozen weight skips only its weight-gradient GEMM, so frozen-base LoRA is ~4N.
* Attention (no parameters): QK^T and AV are 4*d_attn*ctx per token forward, x3 with backward, where
  d_attn = n_heads * head_dim (the q_proj width) and ctx = w, or min(w, window) on sliding layers.
  Counted over the full square (PaLM / Megatron convention), not halved for causal masking: a causal
  kernel does about half of it.
* Padded tokens count (the model computes them); real tokens/s is reported beside it.
* Activation-checkpointing recompute is NOT counted (model FLOPs, not hardware FLOPs).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

import torch

from align.telemetry.progress import compile_seconds

CONVENTION = (
    "model FLOPs/token = 4*N_active + 2*N_active_trainable + 12*sum_layers(d_attn*ctx); "
    "N_active = >=2-dim params except input-embedding lookups, MoE experts x top_k/num_experts; "
    "attention over the full w x w square (not halved for causality), ctx=min(w, window) on sliding layers; "
    "padded tokens count; activation-checkpoint recompute not counted"
)

# bf16 dense tensor-core peak by `torch.cuda.get_device_name()`. Datasheets quote "with sparsity"
# figures; dense is half of those.
DATASHEET_BF16_TFLOPS: dict[str, tuple[float, str]] = {
    "NVIDIA H200": (989.5, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BFLOAT16 Tensor Core 1,979 TFLOPS "
                           "with sparsity -> 989.5 dense"),
    "NVIDIA H100 80GB HBM3": (989.5, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BFLOAT16 Tensor Core "
                                     "1,979 TFLOPS with sparsity -> 989.5 dense"),
    "NVIDIA A100-SXM4-80GB": (312.0, "NVIDIA A100 Tensor Core GPU datasheet: BFLOAT16 Tensor Core 312 TFLOPS "
                                     "dense (624 with sparsity)"),
}

_TOP_K_NAMES = ("num_experts_per_tok", "top_k_experts", "moe_top_k")
_NUM_EXPERTS_NAMES = ("num_experts", "num_local_experts", "n_routed_experts")


def _config_int(config: Any, names: Iterable[str]) -> Optional[int]:
    for n in names:
        try:
            v = getattr(config, n, None)
        except Exception:  # transformers may refuse a per-layer attribute read globally
            v = None
        if isinstance(v, int) and v > 0:
            return v
    return None


@dataclass
class AttentionLayer:
    d_attn: int
    """n_heads * head_dim: the width of q_proj's output."""
    window: Optional[int]
    """Sliding window of the layer, None for full attention."""


@dataclass
class ModelFlops:
    """The parameter and attention counts behind model FLOPs per token."""

    params_total: int
    params_embedding: int
    """Input-embedding lookup tables (not matmuls)."""
    params_expert: int
    """MoE expert weights (all experts)."""
    experts_active_fraction: float
    """top_k / num_experts; 1.0 for dense models."""
    params_active: int
    """N_active: matmul parameters a token goes through."""
    params_active_trainable: int
    attention: list[AttentionLayer] = field(default_factory=list)
    convention: str = CONVENTION

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "ModelFlops":
        """Count from the BUILT model: modules and parameters, not the requested config."""
        embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out is not None and getattr(out, "weight", None) is not None:
            embedding_ids.discard(id(out.weight))  # a tied LM head is a matmul
        config = getattr(model, "config", None)
        top_k, n_exp = _config_int(config, _TOP_K_NAMES), _config_int(config, _NUM_EXPERTS_NAMES)
        frac = top_k / n_exp if top_k and n_exp else 1.0

        total = emb = expert = 0
        active = active_trainable = 0.0
        seen: set[int] = set()
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            total += n
            if id(p) in embedding_ids:
                emb += n
                continue
            if p.dim() < 2:
                continue  # norms, biases, scales: elementwise, not matmuls
            is_expert = ".experts." in f".{name}" and frac < 1.0
            w = n * (frac if is_expert else 1.0)
            expert += n if is_expert else 0
            active += w
            active_trainable += w if p.requires_grad else 0.0

        layers = []
        global_window = None
        try:
            global_window = getattr(config, "sliding_window", None)
        except Exception:
            global_window = None
        for mod in model.modules():
            q = getattr(mod, "q_proj", None)
            q = getattr(q, "base_layer", q)  # a LoRA-wrapped projection keeps its Linear as base_layer
            if isinstance(q, torch.nn.Linear) and hasattr(mod, "head_dim"):
                window = mod.sliding_window if hasattr(mod, "sliding_window") else global_window
                layers.append(AttentionLayer(d_attn=q.out_features, window=int(window) if window else None))
        return cls(total, emb, expert, frac, int(active), int(active_trainable), layers)

    def per_token(self, width: int) -> float:
        """Model FLOPs per token of a sequence of (padded) width `width`."""
        attn = sum(12 * a.d_attn * (min(width, a.window) if a.window else width) for a in self.attention)
        return 4 * self.params_active + 2 * self.params_active_trainable + attn

    def per_batch(self, rows: int, width: int) -> float:
        return rows * width * self.per_token(width)


@dataclass
class Ceiling:
    tflops: float
    """Measured matmul rate on this device."""
    label: str
    """What was measured: device, dtype, size, statistic."""
    device_name: str
    untrusted: Optional[str] = None
    """Why this rate does not bound the device's throughput (MFU is not measured against it); None when
    it does."""


_CEILINGS: dict[str, Ceiling] = {}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_ceiling(device: torch.device) -> Ceiling:
    """A square matmul's rate on `device`, once per device per process.

    CUDA: bf16 8192^3 on random data (zeros run faster), median of 10 after 3 warm-ups; this is the
    ceiling MFU is measured against. CPU: fp32 512^3, labelled as such: a CPU rate is not a
    performance figure, and a big CPU matmul would cost seconds of a 2-core CI machine.
    """
    key = str(device)
    if key in _CEILINGS:
        return _CEILINGS[key]
    if device.type == "cuda":
        n, dtype, warmup, reps = 8192, torch.bfloat16, 3, 10
        name = torch.cuda.get_device_name(device)
    else:
        n, dtype, warmup, reps = 512, torch.float32, 1, 5
        name = "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    for _ in range(warmup):
        a @ b
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - t0)
    del a, b
    t = statistics.median(times)
    dtype_name = str(dtype).removeprefix("torch.")
    label = f"{name} {dtype_name} {n}^3 matmul, median of {reps} after {warmup} warm-up"
    if device.type != "cuda":
        label += " (CPU rate: not a performance figure)"
    untrusted = None if device.type == "cuda" else (
        f"{device.type}: no trustworthy matmul ceiling (a small fp32 matmul's rate is not the device's peak; "
        "the model's own larger matmuls run faster)")
    c = Ceiling(tflops=2 * n**3 / t / 1e12, label=label, device_name=name, untrusted=untrusted)
    _CEILINGS[key] = c
    return c


def datasheet_tflops(device: torch.device) -> tuple[Optional[float], Optional[str]]:
    if device.type != "cuda":
        return None, None
    return DATASHEET_BF16_TFLOPS.get(torch.cuda.get_device_name(device), (None, None))


def mfu(achieved_tflops: float, denominator: Optional[float], what: str) -> tuple[Optional[float], Optional[str]]:
    """(MFU, None) or (None, why not). Never a value above 1: a utilisation past the denominator says the
    denominator or the FLOP count is wrong, not that the run beat the hardware."""
    if not denominator:
        return None, f"no {what}"
    value = achieved_tflops / denominator
    if value > 1:
        return None, (f"{value:.0%} of the {what} ({denominator:.4g} TFLOP/s) is impossible: that denominator does "
                      "not bound this device, or the FLOP count is wrong; not reported")
    return value, None


def rates(tokens: int, real_tokens: int, loss_tokens: int, flops: float, seconds: float,
          ceiling: Optional[Ceiling], datasheet: Optional[float]) -> dict[str, Any]:
    """The throughput numbers for `seconds` of work. MFU keys are present and null when unknown or
    impossible, and each `*_reason` key says why (None when there is a value)."""
    s = max(seconds, 1e-12)
    achieved = flops / s / 1e12
    if ceiling is None:
        measured, measured_why = None, "no ceiling measured in this process (rank 0 measures it)"
    elif ceiling.untrusted:
        measured, measured_why = None, ceiling.untrusted
    else:
        measured, measured_why = mfu(achieved, ceiling.tflops, f"measured ceiling ({ceiling.label})")
    sheet, sheet_why = mfu(achieved, datasheet, "datasheet figure for this device")
    return {
        "tokens_per_s": tokens / s,
        "real_tokens_per_s": real_tokens / s,
        "loss_tokens_per_s": loss_tokens / s,
        "flops_per_token": flops / tokens if tokens else None,
        "achieved_tflops": achieved,
        "mfu_measured": measured,
        "mfu_measured_reason": measured_why,
        "mfu_datasheet": sheet,
        "mfu_datasheet_reason": sheet_why,
    }


MFU_REASONS = ("mfu_measured_reason", "mfu_datasheet_reason")


def format_mfu(r: dict[str, Any]) -> str:
    """The MFU part of a probe's throughput line: percentages where known, else why there is none."""
    def one(key: str, what: str) -> str:
        if r[key] is None:
            return f"no MFU against the {what}: {r[key + '_reason']}"
        return f"{r[key]:.2%} of the {what}"

    return f"{one('mfu_measured', 'measured ceiling')}; {one('mfu_datasheet', 'datasheet')}"


def document_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the documents of a packed row: a document starts wherever the position is 0."""
    pos = position_ids.reshape(-1).cpu()
    starts = torch.nonzero(pos == 0).reshape(-1).tolist() + [pos.numel()]
    return [b - a for a, b in zip(starts, starts[1:]) if b > a]


@dataclass
class Throughput:
    """Per-step throughput for history/W&B and a run summary for the manifest."""

    flops: ModelFlops
    ceiling: Optional[Ceiling]
    datasheet_tflops: Optional[float]
    datasheet_source: Optional[str]
    skip_first: int = 1
    """Steps left out of the summary: the first one carries allocator and kernel-selection warm-up."""
    _steps: int = field(default=0, init=False)
    _first_s: Optional[float] = field(default=None, init=False)
    """The first step of this process: where the compiled graphs and the autotuning are paid."""
    _all_s: float = field(default=0.0, init=False)
    _compile0: float = field(default_factory=compile_seconds, init=False)
    """compile_seconds() when this run's records began: the process may have compiled for another run."""
    _totals: dict[str, float] = field(init=False, default_factory=lambda: dict(
        tokens=0, real_tokens=0, loss_tokens=0, flops=0.0, seconds=0.0))

    @classmethod
    def build(cls, model: torch.nn.Module, device: torch.device, measure: bool = True) -> "Throughput":
        """`measure`: rank 0 measures the ceiling; other ranks report MFU as null."""
        ceiling = measure_matmul_ceiling(device) if measure else None
        ds, src = datasheet_tflops(device)
        return cls(ModelFlops.from_model(model), ceiling, ds, src)

    def batch_flops(self, batches: Iterable[Any]) -> float:
        """Model FLOPs of micro-batches (anything with `input_ids` of shape [rows, width]). A packed
        batch (`position_ids` restarting at 0 per document) attends within each document only, so its
        attention is counted per document."""
        total = 0.0
        for b in batches:
            pos = getattr(b, "position_ids", None)
            if pos is None:
                total += self.flops.per_batch(*b.input_ids.shape)
            else:
                total += sum(self.flops.per_batch(1, n) for n in document_lengths(pos))
        return total

    def step(self, window: list[Any], seconds: float) -> dict[str, Any]:
        """Metrics of one optimizer step over `window` (the micro-batches) that took `seconds`."""
        tokens = sum(b.tokens for b in window)
        real = sum(b.real_tokens for b in window)
        loss = sum(b.loss_tokens for b in window)
        flops = self.batch_flops(window)
        self._steps += 1
        self._first_s = seconds if self._first_s is None else self._first_s
        self._all_s += seconds
        if self._steps > self.skip_first:
            for k, v in dict(tokens=tokens, real_tokens=real, loss_tokens=loss, flops=flops, seconds=seconds).items():
                self._totals[k] += v
        out = rates(tokens, real, loss, flops, seconds, self.ceiling, self.datasheet_tflops)
        for k in ("tokens_per_s", "real_tokens_per_s", "loss_tokens_per_s"):
            out.pop(k)  # the trainer reports token rates over all ranks; FLOPs and MFU here are this device's
        for k in MFU_REASONS:
            out.pop(k)  # history rows and W&B charts stay numeric; the run summary says why MFU is null
        out["model_flops"] = flops
        # Cumulative, so a reader of any window of steps can tell whether it paid a compile (a benchmark
        # whose warm-up ended before the last graph compiled would otherwise report the compile as speed).
        out["compile_s"] = compile_seconds() - self._compile0
        return out

    def summary(self) -> dict[str, Any]:
        """Whole-run throughput (steps after `skip_first`), every key present, null when unknown."""
        t = self._totals
        counted = max(self._steps - self.skip_first, 0)
        r = rates(int(t["tokens"]), int(t["real_tokens"]), int(t["loss_tokens"]), t["flops"], t["seconds"],
                  self.ceiling, self.datasheet_tflops) if counted else {
            k: None for k in ("tokens_per_s", "real_tokens_per_s", "loss_tokens_per_s", "flops_per_token",
                              "achieved_tflops", "mfu_measured", "mfu_datasheet")}
        if not counted:
            r.update({k: "no step was counted (the first is warm-up)" for k in MFU_REASONS})
        return {
            **{f"throughput/{k}": v for k, v in r.items()},
            "throughput/steps_counted": counted,
            "throughput/scope": "per device: this rank's micro-batches over its step time (rank 0 in the manifest)",
            "throughput/flops_convention": self.flops.convention,
            "throughput/params_active": self.flops.params_active,
            "throughput/params_active_trainable": self.flops.params_active_trainable,
            "throughput/ceiling_tflops": self.ceiling.tflops if self.ceiling else None,
            "throughput/ceiling_label": self.ceiling.label if self.ceiling else None,
            "throughput/datasheet_tflops": self.datasheet_tflops,
            "throughput/datasheet_source": self.datasheet_source,
            **self.compile_cost(),
        }

    def compile_cost(self) -> dict[str, Optional[float]]:
        """Time to the first step, and the share of all step time that dynamo and inductor spent
        compiling (null until a step ran)."""
        spent = compile_seconds() - self._compile0
        return {"throughput/first_step_s": self._first_s, "throughput/compile_s": spent if self._steps else None,
                "throughput/compile_share": min(spent / self._all_s, 1.0) if self._all_s > 0 else None}

    def describe(self) -> dict[str, Any]:
        return {"flops": asdict(self.flops), "ceiling": asdict(self.ceiling) if self.ceiling else None,
                "datasheet_tflops": self.datasheet_tflops, "datasheet_source": self.datasheet_source}
