#!/usr/bin/env bash
# Session 3, last round (two GPUs): the MoE one-step-per-8.5k arms as landed (async telemetry read,
# compiled optimizer with its compiled norm), and 8 micro-batches per step with the compiled optimizer.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 300 python3 bench/moe.py --steps 16 --warmup 5 \
    --arms ref,align_step_fill,align_overlap,opt_compiled --define "opt_compiled=$F optimizer.compile=true" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 70 python3 -m pytest -q -m gpu tests/gpu/test_compiled_step_gpu.py -p no:cacheprovider > $OUT/g1_test.txt 2>&1;
  OUT=$OUT/g1 timeout 220 python3 bench/moe.py --steps 12 --warmup 4 --arms ref,comp_accum8 \
    --define "comp_accum8=$F trainer.grad_accum=8 optimizer.compile=true" > $OUT/g1.txt 2>&1 ) &
wait
tail -2 $OUT/g1_test.txt
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 2500; done
