#!/usr/bin/env bash
# One round on the two-GPU machine: the dense table on GPU 0 and the MoE table on GPU 1, at once.
# Usage (after the wheel preamble): bash scripts/gpu_round.sh   -> $OUT/dense.txt, $OUT/moe.txt
set -u
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/dense timeout 570 python3 bench/run.py --steps 30 --warmup 8 --align-steps 40 --align-warmup 10 \
    --arms hf_padded,hf_flatten,hf_ceiling,align_shuffle,align_bucket,align_best,abl_masked,abl_cudnn,abl_compiled \
    > $OUT/dense.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OUT=$OUT/moe timeout 570 python3 bench/moe.py --steps 20 --warmup 5 \
    --arms ref,align_step_8k,align_step_fill,align_accum4,align_8bit,align_no_telemetry,align_ac_32k \
    --profile align_step_fill > $OUT/moe.txt 2>&1 ) &
wait
grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/dense.txt | tail -c 4000
echo ====
grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/moe.txt | grep -v '^{' | tail -c 6500
