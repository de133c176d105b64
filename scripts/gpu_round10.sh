#!/usr/bin/env bash
# Session 4, round 10 (two GPUs): align with compiled OLMoE blocks, after the mask check stopped
# filling the blocks' compile caches. GPU 0: the MFU arms (AC + chunked CE, 32k); GPU 1: one
# optimizer step per ~8.5k tokens.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8"
B="trainer.compile=true trainer.compile_dynamic=true"
AC="sampler.max_tokens=32768 sampler.pad_to_multiple_of=8 parallel.activation_checkpointing=true trainer.loss_chunk_tokens=8192 optimizer.compile=true"
( export CUDA_VISIBLE_DEVICES=0; OUT=$OUT/g0 timeout 500 python3 bench/moe.py --steps 14 --warmup 5 --arms ref,ac_q_blocks,ac_h_blocks \
    --define "ac_q_blocks=$AC parallel.activation_checkpointing_fraction=0.25 $B" \
    --define "ac_h_blocks=$AC parallel.activation_checkpointing_fraction=0.5 $B" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 500 python3 bench/moe.py --steps 16 --warmup 6 \
    --arms ref,opt_compiled,blocks_fused,blocks_opt_compiled --define "opt_compiled=$F optimizer.compile=true" \
    --define "blocks_fused=$F $B" --define "blocks_opt_compiled=$F $B optimizer.compile=true" > $OUT/g1.txt 2>&1 ) &
wait
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{\|Configuration class" $OUT/$g.txt | tail -c 2500; grep -h '"dynamo"' $OUT/$g.txt | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['arm'], 'dynamo', json.dumps(r.get('dynamo'))[:400])"; grep -h "recompile_limit\|last reason" $OUT/$g/moe/*.log | cut -c1-300 | head -6; done
