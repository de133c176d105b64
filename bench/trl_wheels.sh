#!/usr/bin/env bash
# The wheels the TRL reference arms (bench/trl_arm.py; bench/trl_grpo.py imports nothing more) need on the
# offline GPU machine, beside the
# base set (hydra-core, omegaconf, antlr4, transformers; docs/NOTES.md#measuring-on-the-gpu-machine): trl,
# datasets and the two datasets needs that the GPU image lacks (dill, multiprocess), at the versions
# installed here, into ./.whl (git-ignored). pyarrow, pandas, xxhash, fsspec, huggingface-hub and
# accelerate come with the image (bench/gpu_suite.sh prints their versions first). All four are
# pure-Python wheels, about 1.8 MB together. Run from the project root, on a machine with the registry:
#
#   bash bench/trl_wheels.sh          # after the base set (docs/NOTES.md#measuring-on-the-gpu-machine)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT="--python-version 3.12 --implementation cp"
for n in 17 24 27 28 31 34; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
PY=${PYTHON:-python3}
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo "$2"; }
for spec in "trl==$(ver trl 1.16.0)" "datasets==$(ver datasets 5.2.0)" "dill==$(ver dill 0.4.1)" \
            "multiprocess==$(ver multiprocess 0.70.19)"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: $PLAT -d .whl "$spec" 2>&1 | grep -v '^WARNING' || true
done
du -sh .whl; ls .whl
