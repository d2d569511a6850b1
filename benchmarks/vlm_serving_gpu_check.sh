#!/usr/bin/env bash
# The GPU side of issue #51's serving with images in one run, results under $OUT:
#   1. tests/vision/test_embed_cuda.py: LLaVA's and Qwen2.5-VL's towers copy host images to the GPU without a host
#      sync; with BEFORE_TREE=<checkout without the pinned copies> the same test also runs against that tree's
#      package (a `vlchat` link to it first on PYTHONPATH), where it should fail;
#   2. benchmarks.serving --images, concurrency 128, each with transformers' generate on the first $PEER requests:
#      the LLaVA-1.5-7B shape and the Qwen2.5-VL-7B shape with one image per request ($N1 requests), then
#      Qwen2.5-VL-7B with two ($N2); started runs are cut at $DEADLINE seconds from the start.
# Finished runs' .json/.md/.png files are packed into $OUT/serving.tgz (a device call returns only a few files).
# Run from the repository root on one GPU, with vlchat installed:  OUT=/some/dir bash benchmarks/vlm_serving_gpu_check.sh
set -uo pipefail
OUT=${OUT:-$PWD/vlm_serving_gpu_out}
N1=${N1:-200} N2=${N2:-150} PEER=${PEER:-8} DEADLINE=${DEADLINE:-420}
# other shapes and arguments for a CPU dry run: QWEN=qwen2.5-vl-smoke LLAVA=llava-smoke EXTRA="--dtype float32"
QWEN=${QWEN:-qwen2.5-vl-7b} LLAVA=${LLAVA:-llava-1.5-7b} EXTRA=${EXTRA:-}
mkdir -p "$OUT/serving"
start=$SECONDS
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton, transformers as t; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', t.__version__)" | tee -a "$OUT/gpu.txt"

echo "== 1. embed_multimodal without a host sync =="
pytest -q -p no:cacheprovider tests/vision/test_embed_cuda.py > "$OUT/test_embed.log" 2>&1
tail -2 "$OUT/test_embed.log"
if [ -n "${BEFORE_TREE:-}" ]; then
  link=$(mktemp -d) && ln -s "$(cd "$BEFORE_TREE" && pwd)" "$link/vlchat"
  echo "-- against $BEFORE_TREE:"
  PYTHONPATH=$link pytest -q -p no:cacheprovider tests/vision/test_embed_cuda.py > "$OUT/test_embed_before.log" 2>&1
  tail -1 "$OUT/test_embed_before.log"
fi

echo "== 2. serving with images =="
left=$((DEADLINE - (SECONDS - start)))
# repository-root kernels/ must not shadow Hugging Face's `kernels` (-P, the root appended to sys.path)
timeout $((left > 10 ? left : 10)) python -P - "$OUT/serving" "$N1" "$N2" "$PEER" "$QWEN" "$LLAVA" $EXTRA <<'PY'
import sys
import time
import traceback

sys.path.append(".")
from benchmarks import serving  # noqa: E402

out, n1, n2, peer, qwen, llava, *extra = sys.argv[1:]
for shape, images, n in ((llava, 1, n1), (qwen, 1, n1), (qwen, 2, n2)):
    t0 = time.time()
    try:
        serving.main(["--shape", shape, "--images", str(images), "--num-prompts", n, "--concurrency", "128",
                      "--backend", "vlchat", "transformers", "--peer-num-prompts", peer, "--peer-batch", peer,
                      "--out", f"{out}/serving-{shape}-{images}img", *extra])
    except Exception:  # the next shape still runs
        traceback.print_exc()
    print(f"== {shape}, {images} image(s) per request: {time.time() - t0:.0f} s", flush=True)
PY
tar czf "$OUT/serving.tgz" -C "$OUT" serving && rm -rf "$OUT/serving"
