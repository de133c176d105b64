#!/usr/bin/env bash
# Launch `python -m align.train` on N processes of this node (or of many nodes) with torchrun.
#
#   launchers/torchrun.sh [--nproc N] [train overrides...]        e.g.
#   launchers/torchrun.sh --nproc 8 parallel=fsdp model=olmoe model.pretrained=/ckpt/OLMoE-1B-7B-0125
#   NPROC=2 launchers/torchrun.sh parallel=fsdp trainer.device=cpu       # 2 CPU processes over gloo
#
# The run dir is computed ONCE here and passed to every rank as hydra.run.dir (and hydra.sweep.dir),
# because `${now:...}` resolves per rank (docs/pitfalls.md#10). An explicit hydra.run.dir=... wins.
# Many nodes: set NNODES, NODE_RANK and MASTER_ADDR[:MASTER_PORT] on every node, and a run dir that
# every node agrees on (ALIGN_RUN_DIR, or SLURM_JOB_ID gives outputs/slurm-<id>).
#
# torchrun reports any worker failure as exit 1; this script exits with the code the ranks recorded
# (align.control.exit_record): 81 non-finite halt, 143 coordinated stop, 2 refused configuration. The
# ranks record it in a dir of this launch ($ALIGN_EXIT_DIR), so a refusal that wrote nothing into the run
# dir (a bad command line, a finished run dir, a resume refused) still exits 2.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
NPROC="${NPROC:-}"
if [[ "${1:-}" == "--nproc" ]]; then NPROC="$2"; shift 2; fi
if [[ -z "$NPROC" ]]; then
  NPROC="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() or 2)')"
fi
NNODES="${NNODES:-1}"

run_dir=""
for a in "$@"; do [[ "$a" == hydra.run.dir=* ]] && run_dir="${a#hydra.run.dir=}"; done
extra=()
if [[ -z "$run_dir" ]]; then
  if [[ -n "${ALIGN_RUN_DIR:-}" ]]; then run_dir="$ALIGN_RUN_DIR"
  elif [[ -n "${SLURM_JOB_ID:-}" ]]; then run_dir="outputs/slurm-${SLURM_JOB_ID}"
  elif [[ "$NNODES" != 1 ]]; then
    echo "launchers/torchrun.sh: NNODES=$NNODES: set ALIGN_RUN_DIR (or hydra.run.dir=) to one dir every node shares" >&2
    exit 2
  else run_dir="outputs/$(date +%Y-%m-%d_%H-%M-%S)-$$"
  fi
  extra+=("hydra.run.dir=$run_dir")
fi
has_sweep=0; for a in "$@"; do [[ "$a" == hydra.sweep.dir=* ]] && has_sweep=1; done
[[ $has_sweep == 0 ]] && extra+=("hydra.sweep.dir=$run_dir")

if [[ "$NNODES" == 1 ]]; then
  rdzv=(--standalone)
else
  rdzv=(--nnodes "$NNODES" --node-rank "${NODE_RANK:?set NODE_RANK}" --rdzv-backend c10d
        --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29500}" --rdzv-id "${RDZV_ID:-align}")
fi

started="$(date +%s)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exit_dir="$(mktemp -d)"
export ALIGN_EXIT_DIR="$exit_dir"
echo "launchers/torchrun.sh: $NPROC process(es) x $NNODES node(s), run dir $run_dir" >&2
"$PYTHON" -m torch.distributed.run "${rdzv[@]}" --nproc-per-node "$NPROC" --max-restarts 0 \
  -m align.train "$@" "${extra[@]}"
code=$?
if [[ $code != 0 ]]; then
  recorded="$("$PYTHON" -m align.control.exit_record "$exit_dir" 0 2>/dev/null)"
  [[ -z "$recorded" ]] && recorded="$("$PYTHON" -m align.control.exit_record "$run_dir" "$started" 2>/dev/null)"
  [[ -n "$recorded" ]] && code="$recorded"
fi
rm -rf "$exit_dir"
exit "$code"
