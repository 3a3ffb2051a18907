#!/usr/bin/env bash
# The Megatron GPU checks, as run on the lent GPU machine (Python 3.12, torch with
# CUDA, no network, no Ray). Usage, from the repository root on that machine:
#   bash tests/device/megatron_cuda.sh
# Wheels it needs (pydantic, hydra-core, omegaconf, megatron-core 0.16.1,
# transformers >= 5.23, pebble, ...) are expected in .whl/ (not committed:
# fetched beforehand with `pip download --no-deps` for the machine's Python),
# and the built extension packages/rlinf-core/src/rlinf/core/_native.abi3.so.
# Ray cannot be installed there: tests/device/stand_ins/ray lets rlinf.sched
# import; only tests that build workers in-process (no cluster) run.
set -euo pipefail
site=/tmp/rlinf-site
pip install --quiet --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="tests/device/stand_ins:$site:packages/rlinf-core/src:packages/rlinf-sched/src:packages/rlinf-reasoning/src"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -m pytest -p no:cacheprovider -q -rA -s \
  packages/rlinf-reasoning/tests/test_megatron_cuda.py \
  "packages/rlinf-reasoning/tests/test_actor_megatron.py::test_cuda_tp1_step_sync_and_resume_equal_fsdp" \
  "$@"
