#!/usr/bin/env bash
# Session 3, round 1 (two GPUs at once): the optimizer levers for the MoE one-step-per-8k target.
# GPU 0: reference, baseline, overlap, torchao 8-bit (+overlap), no telemetry. GPU 1: the overlap GPU
# test, then overlap with accumulation and a compiled-blocks arm, then the baseline's kernel table.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 540 python3 bench/moe.py --steps 16 --warmup 4 \
    --arms ref,align_step_fill,align_overlap,align_8bit,align_8bit_overlap,align_no_telemetry \
    --define "align_8bit_overlap=$F optimizer=adamw8bit optimizer.overlap=true" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_overlap_gpu.py -p no:cacheprovider > $OUT/g1_test.txt 2>&1;
  OUT=$OUT/g1 timeout 240 python3 bench/moe.py --steps 16 --warmup 4 --arms ref,ov_accum4 \
    --define "ov_accum4=$F trainer.grad_accum=4 optimizer.overlap=true" --profile align_step_fill > $OUT/g1.txt 2>&1;
  OUT=$OUT/g1c timeout 170 python3 bench/moe.py --steps 16 --warmup 4 --arms compiled \
    --define "compiled=$F trainer.compile=true" > $OUT/g1c.txt 2>&1 ) &
wait
tail -3 $OUT/g1_test.txt
for g in g0 g1 g1c; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 5000; done
