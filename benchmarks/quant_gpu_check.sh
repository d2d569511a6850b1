#!/usr/bin/env bash
# GPU check of quantized weights (#48) on one H100/H200, from the repository root of a bare device machine:
#
#   bash benchmarks/quant_gpu_check.sh
#
# 1. tests: the quantized kernels' and layers' GPU tests (W4A16, FP8, GGUF dequantization; CUDA-graph decoding);
# 2. quant_decode (engine decode steps of the 7B shape: fp16, GPTQ W4A16, FP8);
# 3. quant_linear (W4A16/FP8 projections), gguf_linear (GGUF projections);
# 4. serving_fp16, then fp8_gemv_tune (the FP8 GEMV's tiles against torch._scaled_mm at 1-128 rows) followed in
#    its process by the --quantization fp8 serving run with its picked tiles (Llama-2-7B shape, sharegpt-like-v1,
#    1,000 prompts, concurrency 128);
# 5. serving_fp8 (--quantization fp8, the committed tiles), serving_fp8kv (--kv-cache-dtype fp8, #49) and
#    serving_fp8_fp8kv (both): with serving_fp16 in the same call, the ratios the issues ask for.
# Each step has its own time limit; all of them can outrun one 10-minute device call (on an H100 2026-12-06
# steps 1-2 took 4 minutes; a serving step about a minute), so STEPS="quant_decode serving_fp16 serving_fp8kv" runs
# only those named. A step that fails or runs out of time is recorded and the next one runs. $OUT (default ./quant_gpu_out) receives two files:
# summary.md and quant_gpu_results.tar.gz (every log and result); the last thing printed is the summary.
set -uo pipefail
OUT=${OUT:-$PWD/quant_gpu_out}
mkdir -p "$OUT"
RUN="$OUT/run"  # under $OUT: a call cut off at its limit still brings back the steps that ended
mkdir -p "$RUN/results"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
START=$(date +%s)

# vlchat without installing it, and the packages the device image lacks (.whl/ carried along)
source benchmarks/device_setup.sh >"$RUN/setup.log" 2>&1
$PY - <<'EOF' | tee "$RUN/env.txt"
import importlib.util, torch, triton
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__)
missing = [m for m in ("pytest", "gguf", "compressed_tensors", "transformers") if importlib.util.find_spec(m) is None]
print("missing python packages:", ", ".join(missing) or "none")
EOF

declare -A STATUS TIME
step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log to $RUN/NAME.log
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$RUN/$name.log" 2>&1
  rc=$?
  TIME[$name]=$(($(date +%s) - t0))
  case $rc in 0) STATUS[$name]=ok ;; 124 | 137) STATUS[$name]="timeout ${limit}s" ;; *) STATUS[$name]="failed rc=$rc" ;; esac
  echo "$name: ${STATUS[$name]} (${TIME[$name]} s)"
}

want() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
want tests && step tests 120 $PY -m pytest -q -x -p no:cacheprovider \
  tests/kernels/test_ops_quant_linear.py tests/kernels/test_ops_fp8_linear.py tests/kernels/test_ops_gguf_dequant.py tests/kernels/test_ops_gguf_linear.py \
  tests/llm/test_quantization.py::test_a_quantized_model_decodes_the_same_from_cuda_graphs_as_eagerly \
  tests/llm/test_gguf.py::test_tiny_llama_gguf_blocks_on_the_gpu_equal_transformers
want quant_decode && step quant_decode 95 $PY -m benchmarks.quant_decode --out "$RUN/results"
want quant_linear && step quant_linear 90 $PY -m benchmarks.quant_linear --out "$RUN/results"
want gguf_linear && step gguf_linear 35 $PY -m benchmarks.gguf_linear --out "$RUN/results"
SERVE=(--shape llama2-7b --dtype float16 --num-prompts 1000 --concurrency 128)
serve() {  # serve STEP RESULT ARGS...: the serving load with ARGS, results under $RUN/results/RESULT_llama2-7b.*
  local name=$1 result=$2
  shift 2
  want "$name" && step "$name" 90 $PY -m benchmarks.serving "${SERVE[@]}" "$@" --out "$RUN/results/${result}_llama2-7b"
}
serve serving_fp16 serving_fp16
# the tiles' sweep, then the fp8 serving run with its picks put into the process (the committed table when the
# picks equal it)
want fp8_gemv_tune && step fp8_gemv_tune 200 $PY -m benchmarks.fp8_gemv_tune --out "$RUN/results" \
  --serve "${SERVE[@]}" --quantization fp8 --out "$RUN/results/serving_fp8_llama2-7b"
serve serving_fp8 serving_fp8w --quantization fp8
serve serving_fp8kv serving_fp8kv --kv-cache-dtype fp8
serve serving_fp8_fp8kv serving_fp8w_fp8kv --quantization fp8 --kv-cache-dtype fp8

{
  echo
  echo "| step | status | s |"
  echo "|---|---|---|"
  for s in tests quant_decode quant_linear gguf_linear serving_fp16 fp8_gemv_tune serving_fp8 serving_fp8kv \
    serving_fp8_fp8kv; do
    echo "| $s | ${STATUS[$s]:-not run} | ${TIME[$s]:--} |"
  done
  echo
  tail -n 1 "$RUN/tests.log" 2>/dev/null | sed 's/^/tests: /'
  grep -h -A8 "^| format |" "$RUN"/results/quant_decode_*.md 2>/dev/null
  grep -h -m1 -A11 "^| rows | fp16 us" "$RUN"/results/quant_linear_*.md 2>/dev/null | cut -d'|' -f1-7
  grep -h "^Picks" "$RUN"/results/fp8_gemv_tune_*.md 2>/dev/null
  grep -h -i -m1 "req/s" "$RUN/serving_fp16.log" 2>/dev/null | sed "s/^/serving fp16: /"
  grep -h -i -m1 "req/s" "$RUN/fp8_gemv_tune.log" 2>/dev/null | sed "s/^/serving fp8 (picked tiles): /"
  for s in serving_fp8 serving_fp8kv serving_fp8_fp8kv; do
    grep -h -i -m1 "req/s" "$RUN/$s.log" 2>/dev/null | sed "s/^/$s: /"
  done
  echo "total: $(($(date +%s) - START)) s; logs and results: $OUT/quant_gpu_results.tar.gz"
} >"$RUN/summary.md"
tar czf "$OUT/quant_gpu_results.tar.gz" -C "$RUN" .
cp "$RUN/summary.md" "$OUT/summary.md"
cat "$OUT/summary.md"
