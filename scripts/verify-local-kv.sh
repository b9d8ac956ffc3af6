#!/usr/bin/env bash
# vLLM's own KV-cache figures for full-size model shapes on this machine's GPU, with dummy weights (issue 38,
# part 2): for each published config.json under tests/fixtures/model_configs named below, vLLM's LLM engine is
# built with load_format=dummy (random weights of the real shapes: the same weights' memory, no download),
# gpu_memory_utilization 0.9 and otherwise vLLM's defaults, and its log (Available KV cache memory, GPU KV cache
# size, Maximum concurrency) is kept as OUTDIR/<model>.log for the capacity planner's unit test.
#   usage: scripts/verify-local-kv.sh VENV OUTDIR [MODEL[:MAX_MODEL_LEN] ...]
# MODEL is a directory name under tests/fixtures/model_configs; without :MAX_MODEL_LEN the model's own
# (max_position_embeddings) is used, as vLLM does.
set -uo pipefail

venv="$(realpath "$1")" outdir="$(realpath -m "$2")"
shift 2
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(Qwen--Qwen2.5-7B:32768 meta-llama--Meta-Llama-3.1-8B Qwen--Qwen3-8B google--gemma-2-9b-it)

# A file, not stdin: vLLM's engine core is a spawned process that imports the main module again.
cat >"$outdir/kv.py" <<'PY'
import sys

import torch
from vllm import LLM

if __name__ == "__main__":
    print("torch total_memory", torch.cuda.get_device_properties(0).total_memory, flush=True)
    extra = {"max_model_len": int(sys.argv[2])} if sys.argv[2] else {}
    LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, gpu_memory_utilization=0.9, **extra)
    print("engine ready", flush=True)
PY

for entry in "${models[@]}"; do
  name="${entry%%:*}" length=""
  [ "$name" != "$entry" ] && length="${entry#*:}"
  echo "=== $name ${length:-(max_position_embeddings)}"
  started="$(date +%s)"
  # Offline: the model directory holds only the published config; no tokenizer is read.
  HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 timeout 240 "$venv/bin/python" "$outdir/kv.py" \
    "tests/fixtures/model_configs/$name" "$length" >"$outdir/$name.log" 2>&1
  echo "rc=$? seconds=$(( $(date +%s) - started ))" >>"$outdir/$name.log"
  grep -E "total_memory|non-default args|Model loading took|Available KV cache memory|GPU KV cache size|Maximum concurrency|Actual usage|engine ready|Error|rc=" \
    "$outdir/$name.log" | cut -c1-300
done
