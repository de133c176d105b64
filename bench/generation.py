"""Generation bench: align's engine (align.generation) against plain `model.generate` on the same
prompts, the dense bench model (bench/base_dense: Mistral shape, 0.89 B) with bf16 weights, random init:

  plain_dynamic    model.generate with the dynamic cache: the baseline
  engine_dynamic   align's engine, mode=dynamic (dynamic cache, eager)
  engine_static    align's engine, mode=static (static cache, eager)
  engine_compiled  align's engine, mode=compiled (static cache, decode step under torch.compile; CUDA only)
  align_eager      align's own decode loop (backend=align), eager steps
  align_graphs     align's own decode loop, each decode step a CUDA graph replay (CUDA only)

Beside each arm: the floor of bench/decode_bound.py (weights and live keys/values read once per step, over
the copy bandwidth measured in the same process) and the arm's share of it.

Every arm samples at temperature 1 from the whole vocabulary (top-k and top-p off) with EOS as the stop
token, as an evaluation does; prompts: 64 GSM8K test questions through the bundled chat template, each
cut to 128 tokens (the user turn's text cut, its end and the assistant's turn kept), in one batch of
64 (the engine's default batch size), 256 new tokens. Each arm runs --warmup calls (the compiled arm compiles in the
first), then --calls timed calls; samples/s = completions / seconds, generated tokens/s = generated
tokens (up to and including a stop) / seconds, peak = allocated memory over the arm (reset before it).
Arms run one after another in one process on one model (no arm keeps a cache: transformers builds a
new cache per call). Writes $OUT/generation.json and $OUT/generation.md; prints the table.

    python bench/generation.py                      # on the GPU: ~1.5 min
    python bench/generation.py --tiny               # the tiny preset on the CPU: measures nothing
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import compose_typed, tiny_overrides  # noqa: E402

EXPERIMENT = "bench/base_dense"
ARMS = ("plain_dynamic", "engine_dynamic", "engine_static", "engine_compiled", "align_eager", "align_graphs")
CUDA_ONLY = ("engine_compiled", "align_graphs")
BASELINE = "plain_dynamic"
GSM8K_TEST = ROOT / "align" / "data" / "assets" / "gsm8k" / "test.jsonl"


def bench_config(tiny: bool, experiment: str = EXPERIMENT):
    """The experiment's typed config with bf16 weights created on the device (tiny: its CPU preset)."""
    base = [f"experiment={experiment}", "model.dtype=bfloat16", "model.init_on_device=true"]
    typed = compose_typed(base)
    return compose_typed([*base, *tiny_overrides(typed)]) if tiny else typed


def bench_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """`n` prompts of exactly `length` tokens: question i (then the next ones, as long as it takes) as one
    user turn, its text cut so that the turn's end and the generation prompt still close it."""
    from align.data.preference import render_ids

    questions = [json.loads(line)["question"] for line in GSM8K_TEST.read_text().splitlines() if line.strip()]
    close = render_ids(tokenizer, [{"role": "user", "content": "x"}], add_generation_prompt=True)[-2:]
    out = []
    for i in range(n):
        k, ids = i, []
        while len(ids) < length:
            k += 1
            text = "\n\n".join(questions[j % len(questions)] for j in range(i, k))
            ids = render_ids(tokenizer, [{"role": "user", "content": text}], add_generation_prompt=True)
        out.append(ids[:length - len(close)] + close)
    return out


def plain_generate(model, pad_id: int, eos_ids: Sequence[int], max_new: int) -> Callable:
    """transformers' generate as a user calls it: left-padded batch with its mask, dynamic cache."""
    from transformers import GenerationConfig

    def call(prompts: list[list[int]]) -> list[int]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):], mask[r, width - len(p):] = torch.as_tensor(p), 1
        cfg = GenerationConfig(max_new_tokens=max_new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                               pad_token_id=pad_id, eos_token_id=list(eos_ids), use_cache=True)
        with torch.no_grad():
            seqs = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                  generation_config=cfg)
        return [completion_length(row, set(eos_ids)) for row in seqs[:, width:].tolist()]

    return call


def completion_length(tokens: list[int], stops: set[int]) -> int:
    """Generated tokens of one row up to and including its first stop token."""
    for i, t in enumerate(tokens):
        if t in stops:
            return i + 1
    return len(tokens)


def engine_generate(model, arm: str, pad_id: int, eos_ids: Sequence[int], max_new: int, batch: int) -> Callable:
    from align.generation import Backend, EngineConfig, GenerateMode, SamplingSpec, build_engine

    backend, mode = arm.split("_")
    mode = {"eager": "static", "graphs": "compiled"}.get(mode, mode)
    cfg = EngineConfig(backend=Backend.hf if backend == "engine" else Backend.align, mode=GenerateMode(mode),
                       batch_size=batch)
    engine = build_engine(cfg, model, pad_token_id=pad_id, eos_token_ids=eos_ids)
    spec = SamplingSpec(max_new_tokens=max_new, temperature=1.0)

    def call(prompts: list[list[int]]) -> list[int]:
        with torch.no_grad():
            return [c.num_tokens for c in engine.generate(prompts, spec)]

    call.rows = batch  # type: ignore[attr-defined]

    call.describe = engine.describe  # type: ignore[attr-defined]
    return call


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_arm(name: str, call: Callable, prompts: list[list[int]], warmup: int, calls: int,
            device: torch.device) -> dict[str, Any]:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    first = None
    for _ in range(warmup):
        t = time.perf_counter()
        call(prompts)
        sync(device)
        first = first if first is not None else time.perf_counter() - t
    generated, lengths, t0 = 0, [], time.perf_counter()
    for _ in range(calls):
        lengths = call(prompts)
        generated += sum(lengths)
    sync(device)
    seconds = time.perf_counter() - t0
    cuda = device.type == "cuda"
    return {"arm": name, "completion_lengths": lengths, "calls": calls, "seconds": seconds, "first_call_s": first,
            "samples_per_s": len(prompts) * calls / seconds, "generated_tokens_per_s": generated / seconds,
            "generated_tokens_per_call": generated / calls,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            "engine": call.describe() if hasattr(call, "describe") else None}


def add_bounds(results: list[dict[str, Any]], model, prompts, rows: int, bandwidth: float) -> None:
    """Each arm's floor (bench/decode_bound.py) at its own last call's completion lengths, and its share."""
    from bench.decode_bound import bound

    for r in results:
        if "error" in r:
            continue
        b = bound(model, [len(p) for p in prompts], r["completion_lengths"], rows, bandwidth)
        r["bound"] = b
        r["bound_share"] = r["generated_tokens_per_s"] / b["tokens_per_s"]


def add_ratios(results: list[dict[str, Any]]) -> None:
    base = next((r for r in results if r["arm"] == BASELINE and "error" not in r), None)
    for r in results:
        ok = base is not None and "error" not in r
        r[f"vs_{BASELINE}"] = r["samples_per_s"] / base["samples_per_s"] if ok else None


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(results: list[dict[str, Any]], setup: dict[str, Any]) -> str:
    lines = [f"{setup['prompts']} prompts x {setup['prompt_tokens']} tokens, {setup['max_new_tokens']} new tokens, "
             f"temperature 1, {setup['device']}, {setup['dtype']}; {setup['calls']} timed calls after "
             f"{setup['warmup']} warm-up", "",
             f"| arm | samples/s | generated tok/s | first call s | peak GiB | vs {BASELINE} | bound tok/s | "
             "share of bound | notes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        g = r.get
        vs = g(f"vs_{BASELINE}")
        keys = ("backend", "mode", "cache_implementation", "compile", "cuda_graphs", "decode_attention")
        note = r.get("error") or ", ".join(f"{k}={r['engine'][k]}" for k in keys if k in (r.get("engine") or {}))
        b = (r.get("bound") or {}).get("tokens_per_s")
        lines.append(f"| {r['arm']} | {_fmt(g('samples_per_s'), ',.1f')} | {_fmt(g('generated_tokens_per_s'), ',.0f')} "
                     f"| {_fmt(g('first_call_s'), '.1f')} | {_fmt(g('peak_mem_gib'), '.1f')} | "
                     f"{_fmt(vs, '.2f') + ('x' if vs is not None else '')} | {_fmt(b, ',.0f')} | "
                     f"{_fmt(g('bound_share'), '.0%')} | {note} |")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, in order (of {', '.join(ARMS)})")
    ap.add_argument("--experiment", default=EXPERIMENT, help="the model's experiment (bench/base_moe: OLMoE-1B-7B)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=None,
                    help="rows per engine backend call (default: --prompts, one batch); the plain arm takes one batch")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per arm (the compiled arm compiles here)")
    ap.add_argument("--calls", type=int, default=2, help="timed calls per arm")
    ap.add_argument("--tiny", action="store_true", help="the tiny preset on the CPU, 4 x 16 prompts, 8 new tokens")
    ap.add_argument("--dry-run", action="store_true", help="validate the arguments, print the plan, run nothing")
    a = ap.parse_args(argv)
    a.arms = [x for x in a.arms.split(",") if x]
    bad = [x for x in a.arms if x not in ARMS]
    if bad or not a.arms:
        ap.error(f"--arms {','.join(bad)}: accepted: {', '.join(ARMS)}")
    if min(a.prompts, a.prompt_tokens, a.new_tokens, a.warmup, a.calls, a.batch_size or 1) < 1:
        ap.error("--prompts, --prompt-tokens, --new-tokens, --batch-size, --warmup and --calls must be >= 1")
    if a.tiny:
        a.prompts, a.prompt_tokens, a.new_tokens = min(a.prompts, 4), min(a.prompt_tokens, 16), min(a.new_tokens, 8)
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        print(f"generation: arms {', '.join(a.arms)}; {a.prompts} prompts x {a.prompt_tokens} tokens, "
              f"{a.new_tokens} new tokens, {a.warmup} warm-up + {a.calls} timed calls per arm")
        return 0
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    typed = bench_config(a.tiny, a.experiment)
    device = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    tok = load_tokenizer(typed.model)
    torch.manual_seed(typed.trainer.seed)
    model = build_model(typed.model, typed.attention, tok, device, init_on_device=True).model.to(device).eval()
    prompts = bench_prompts(tok, a.prompts, a.prompt_tokens)
    pad, eos = tok.pad_token_id, [tok.eos_token_id]
    setup = {"prompts": a.prompts, "batch_size": a.batch_size or a.prompts, "prompt_tokens": a.prompt_tokens,
             "max_new_tokens": a.new_tokens,
             "warmup": a.warmup, "calls": a.calls, "device": torch.cuda.get_device_name() if device.type == "cuda"
             else "cpu", "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
             "experiment": a.experiment, "torch": torch.__version__}
    results = []
    for name in a.arms:
        if name in CUDA_ONLY and device.type != "cuda":
            results.append({"arm": name, "error": "not run: needs CUDA"})
            continue
        call = plain_generate(model, pad, eos, a.new_tokens) if name == BASELINE else \
            engine_generate(model, name, pad, eos, a.new_tokens, a.batch_size or a.prompts)
        results.append(run_arm(name, call, prompts, a.warmup, a.calls, device))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "engine"}), flush=True)
    from bench.decode_bound import copy_bandwidth

    setup["copy_bandwidth_bytes_per_s"] = copy_bandwidth(device)
    add_bounds(results, model, prompts, a.batch_size or a.prompts, setup["copy_bandwidth_bytes_per_s"])
    add_ratios(results)
    md = table(results, setup)
    print(md)
    out = Path(os.environ.get("OUT", "outputs/bench")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "generation.json").write_text(json.dumps({"setup": setup, "results": results}, indent=1))
    (out / "generation.md").write_text(md + "\n")
    return 1 if any("error" in r and not r["error"].startswith("not run") for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
