#!/usr/bin/env bash
# Piecewise CUDA graphs (llm/engine/piecewise.py, issue #51's host overhead) on one GPU in one run, results under $OUT:
#   1. the GPU tests of pieces against eager steps and of the decode graphs (test_engine_cuda.py's pieces test,
#      tests/llm/test_cuda_graphs.py); their pass is what turning `piecewise_graph_tokens` on by default waits for;
#   2. benchmarks.serving, llama2-7b shape, $N prompts at concurrency 128, with --piecewise-graph-tokens 0 and then
#      $PIECES, each followed by its step profile at batch 128 (a decode step and a decode + 256-token prefill step:
#      profiled, kernel and unprofiled times); started runs are cut at $DEADLINE seconds from the start;
# then a table of req/s and mixed-step times for both, printed last.
# Run from the repository root on one GPU, with vlchat installed:  OUT=/some/dir bash benchmarks/piecewise_gpu_check.sh
# Other shapes and workloads: SHAPE=llava-1.5-7b EXTRA="--images 1" N=300; SKIP_TESTS=1 leaves out part 1.
set -uo pipefail
OUT=${OUT:-$PWD/piecewise_gpu_out}
N=${N:-1000} PIECES=${PIECES:-1024} DEADLINE=${DEADLINE:-540} SHAPE=${SHAPE:-llama2-7b} EXTRA=${EXTRA:-}
mkdir -p "$OUT"
start=$SECONDS
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 VLCHAT_LAUNCH_CHECK=1
left() { local s=$((DEADLINE - (SECONDS - start))); echo $((s > 10 ? s : 10)); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

echo "== 1. GPU tests: pieces against eager steps =="
[ -n "${SKIP_TESTS:-}" ] && echo "(skipped: SKIP_TESTS)" > "$OUT/tests.log" ||
timeout 200 pytest -q -p no:cacheprovider --timeout 90 -o faulthandler_timeout=80 \
  tests/llm/test_engine_cuda.py::test_prefill_and_mixed_steps_replayed_in_pieces_match_eager_steps \
  tests/llm/test_cuda_graphs.py > "$OUT/tests.log" 2>&1
tests_rc=$?
tail -3 "$OUT/tests.log"

echo "== 2. serving, pieces off and on =="
export VLCHAT_LAUNCH_CHECK=0  # the serving runs time the product's launch path
for pieces in 0 "$PIECES"; do
  # repository-root kernels/ must not shadow Hugging Face's `kernels` (-P, the root appended to sys.path)
  timeout "$(left)" python -P -c "import sys, runpy; sys.path.append('.'); m = sys.argv.pop(1); runpy.run_module(m, run_name='__main__', alter_sys=True)" \
    benchmarks.serving --shape "$SHAPE" --num-prompts "$N" --concurrency 128 --backend vlchat \
    --piecewise-graph-tokens "$pieces" --profile-batch 128 --out "$OUT/serving-$SHAPE-pieces-$pieces" $EXTRA \
    > "$OUT/serving-pieces-$pieces.log" 2>&1
  echo "pieces $pieces: rc=$? $(grep -m1 'req/s in' "$OUT/serving-pieces-$pieces.log")"
done

echo
echo "== summary ($((SECONDS - start)) s; rc 124 = cut off at the deadline) =="
echo "tests rc=$tests_rc: $(tail -1 "$OUT/tests.log")"
python - "$OUT" "$SHAPE" "$PIECES" <<'EOF'
import json, sys
out, shape, pieces = sys.argv[1:]
print("| pieces | req/s | decode step ms (kernels) | mixed step ms profiled (kernels) | mixed unprofiled ms |")
print("|---|---|---|---|---|")
for p in ("0", pieces):
    try:
        r = json.load(open(f"{out}/serving-{shape}-pieces-{p}.json"))
    except OSError:
        print(f"| {p} | (no result) | | | |")
        continue
    rps = r["results"].get("vlchat", {}).get("request_throughput", float("nan"))
    prof = r["backend_info"].get("decode_step_profile", {})
    mixed = prof.get("decode_plus_prefill_256", {})
    print(f"| {p} | {rps:.2f} | {prof.get('step_ms', 0):.2f} ({prof.get('gpu_kernel_ms', 0):.2f}) | "
          f"{mixed.get('step_ms', 0):.2f} ({mixed.get('gpu_kernel_ms', 0):.2f}) | "
          f"{prof.get('decode_plus_prefill_256_unprofiled_ms', 0):.2f} |")
EOF
