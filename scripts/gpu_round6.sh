#!/usr/bin/env bash
# (optimizer.step_first, used by the host_first arms below, was removed after round 7: no measurable effect.)
# Session 3, final round (two GPUs at once): the numbers behind docs/performance.md's session-3 tables.
# GPU 0: MoE at one optimizer step per ~8.5k tokens (fused step-first, host-first, overlap, compiled
# optimizer, telemetry off) and with 4 micro-batches per step. GPU 1: GPU tests, the dense best arm
# against HF's padded and ceiling arms (the new boundary is the default there too), then the MFU arms.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
AC="sampler.pad_to_multiple_of=8 parallel.activation_checkpointing=true trainer.loss_chunk_tokens=8192 sampler.max_tokens=32768"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 timeout 575 python3 bench/moe.py --steps 16 --warmup 5 \
    --arms ref,align_step_fill,host_first,align_overlap,opt_compiled,notel,ov_accum4,comp_accum4 \
    --define "host_first=$F optimizer.step_first=false" --define "opt_compiled=$F optimizer.compile=true" \
    --define "notel=$F model.moe.telemetry=false" --define "ov_accum4=$F trainer.grad_accum=4 optimizer.overlap=true" \
    --define "comp_accum4=$F trainer.grad_accum=4 optimizer.compile=true" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 130 python3 -m pytest -q -m gpu tests/gpu/test_compiled_step_gpu.py tests/gpu/test_overlap_gpu.py tests/gpu/test_moe_telemetry_gpu.py -s -p no:cacheprovider > $OUT/g1_test.txt 2>&1;
  OUT=$OUT/dense timeout 200 python3 bench/run.py --steps 30 --warmup 8 --align-steps 40 --align-warmup 10 \
    --arms hf_padded,hf_ceiling,align_best > $OUT/dense.txt 2>&1;
  OUT=$OUT/g1 timeout 240 python3 bench/moe.py --steps 12 --warmup 4 --arms ref,ac32k,ac32k_quarter,ac32k_quarter_opt \
    --define "ac32k=$AC" --define "ac32k_quarter=$AC parallel.activation_checkpointing_fraction=0.25" \
    --define "ac32k_quarter_opt=$AC parallel.activation_checkpointing_fraction=0.25 optimizer.compile=true" > $OUT/g1.txt 2>&1 ) &
wait
grep -i 'telemetry\|passed\|failed\|kernel' $OUT/g1_test.txt | grep -v Warn | tail -8
echo "== dense"; grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/dense.txt | grep -v '^{' | tail -c 2500
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 4200; done
