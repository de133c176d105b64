#!/usr/bin/env bash
# Exploration round on the two-GPU machine: dense levers on GPU 0, MoE levers on GPU 1, at once.
# Usage (after the wheel preamble): bash scripts/gpu_round.sh   -> $OUT/dense.txt, $OUT/moe.txt
set -u
F="sampler=budget sampler.bucket_size=100000 sampler.mask_padding=false"
FL="attention.sdpa_kernels=[flash,efficient,cudnn,math]"
( CUDA_VISIBLE_DEVICES=0 OUT=$OUT/dense timeout 560 python3 bench/run.py --steps 30 --warmup 8 --align-steps 40 --align-warmup 10 \
    --arms hf_ceiling,abl_budget_nomask,x_flash,x_b24k_flash,x_pad8_flash,x_b32k_flash \
    --define "x_flash=$F sampler.max_tokens=16384 sampler.pad_to_multiple_of=64 $FL" \
    --define "x_b24k_flash=$F sampler.max_tokens=24576 sampler.pad_to_multiple_of=64 $FL" \
    --define "x_pad8_flash=$F sampler.max_tokens=16384 sampler.pad_to_multiple_of=8 $FL" \
    --define "x_b32k_flash=$F sampler.max_tokens=32768 sampler.pad_to_multiple_of=64 $FL" \
    --profile abl_budget_nomask > $OUT/dense.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OUT=$OUT/moe timeout 560 python3 bench/moe.py --steps 20 --warmup 5 \
    --arms ref,align_step_8k,m_flash,m_8bit \
    --define "m_flash=sampler.max_tokens=8192 $FL" \
    --define "m_8bit=sampler.max_tokens=8192 optimizer=adamw8bit $FL" \
    --profile align_step_8k > $OUT/moe.txt 2>&1 ) &
wait
grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/dense.txt | tail -c 5500
echo ====
grep -v "Warning\|warn\|^W1\|torchao\|^\[" $OUT/moe.txt | tail -c 5500
