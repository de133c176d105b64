#!/usr/bin/env bash
# Session 3, round 3 (two GPUs at once). GPU 0: the MoE one-step-per-8k arms: fused (step-first),
# overlap, compiled optimizer, telemetry off, compiled blocks. GPU 1: GPU tests, then the MFU arms
# (activation checkpointing: all blocks vs a fraction; chunked CE; bigger micro-batches).
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
AC="sampler.pad_to_multiple_of=8 parallel.activation_checkpointing=true trainer.loss_chunk_tokens=8192"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 570 python3 bench/moe.py --steps 16 --warmup 5 \
    --arms ref,align_step_fill,align_overlap,opt_compiled,notel,blocks_opt_compiled \
    --define "opt_compiled=$F optimizer.compile=true" --define "notel=$F model.moe.telemetry=false" \
    --define "blocks_opt_compiled=$F optimizer.compile=true trainer.compile=true" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_compiled_step_gpu.py tests/gpu/test_overlap_gpu.py -p no:cacheprovider > $OUT/g1_test.txt 2>&1;
  OUT=$OUT/g1 timeout 400 python3 bench/moe.py --steps 12 --warmup 4 --arms ref,ac32k,ac32k_half,ac32k_quarter_opt \
    --define "ac32k=$AC sampler.max_tokens=32768" --define "ac32k_half=$AC sampler.max_tokens=32768 parallel.activation_checkpointing_fraction=0.5" \
    --define "ac32k_quarter_opt=$AC sampler.max_tokens=32768 parallel.activation_checkpointing_fraction=0.25 optimizer.compile=true" > $OUT/g1.txt 2>&1 ) &
wait
tail -4 $OUT/g1_test.txt
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 4000; done
for g in g0 g1; do python3 - "$OUT/$g/moe/moe.json" <<'PY'
import json, sys
try:
    for r in json.load(open(sys.argv[1]))["results"]:
        print(r["arm"], "step:", r.get("optimizer_step"), "dynamo:", r.get("dynamo"), "err:", r.get("error", "")[:200])
except Exception as e:
    print("no results:", e)
PY
done
