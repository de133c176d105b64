#!/usr/bin/env bash
# Session 4, round 9 (two GPUs): does compiling OLMoE's decoder blocks pay once recompiles are gone?
# GPU 0: transformers' model alone, eager vs compiled blocks (static shape, dynamic ragged), then the
# MFU arm with compiled blocks. GPU 1: align's one-step-per-8.5k arm with and without compiled blocks.
set -u
F="sampler.max_tokens=9216 sampler.pad_to_multiple_of=8 optimizer.compile=true"
AC="sampler.max_tokens=32768 sampler.pad_to_multiple_of=8 parallel.activation_checkpointing=true parallel.activation_checkpointing_fraction=0.25 trainer.loss_chunk_tokens=8192 optimizer.compile=true"
( export CUDA_VISIBLE_DEVICES=0; OUT=$OUT/g0 timeout 330 python3 bench/moe_blocks.py --steps 12 > $OUT/g0_blocks.txt 2>&1;
  OUT=$OUT/g0 timeout 230 python3 bench/moe.py --steps 14 --warmup 5 --arms ref,ac_blocks \
    --define "ac_blocks=$AC trainer.compile=true trainer.compile_dynamic=true" > $OUT/g0.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/g1 timeout 560 python3 bench/moe.py --steps 16 --warmup 6 \
    --arms ref,opt_compiled,blocks_dyn --define "opt_compiled=$F" \
    --define "blocks_dyn=$F trainer.compile=true trainer.compile_dynamic=true" > $OUT/g1.txt 2>&1 ) &
wait
echo "== g0 blocks"; grep -E "^(eager|static|dynamic)" $OUT/g0_blocks.txt | cut -c1-1500; tail -3 $OUT/g0_blocks.txt
for g in g0 g1; do echo "== $g"; grep -v "Warning\|warn\|^W1\|torchao\|^\[\|^{" $OUT/$g.txt | tail -c 2000; grep -h '"dynamo"' $OUT/$g.txt | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['arm'], 'dynamo', json.dumps(r.get('dynamo'))[:600])"; done
