#!/usr/bin/env bash
# Make this working tree runnable on a GPU machine that has torch, triton and transformers but no network and no
# vlchat install (the lent H100/H200): the *_gpu_check.sh scripts and the GPU tests need vlchat importable and a few
# packages the machine lacks.
#
#   bash benchmarks/device_setup.sh download   # here, with PyPI: wheels for CPython 3.12 into .whl/ (git-ignored)
#   source benchmarks/device_setup.sh          # there, from the repository root (.whl/ carried along): installs
#                                              # them into /tmp/vlchat-site and puts `vlchat` (this tree) on
#                                              # PYTHONPATH, so that `pytest` and `python -m benchmarks...` work
#
# Only packages the machine lacks are listed: vlchat's own runtime dependencies that its GPU paths import, and
# pytest with the plugins the suite's configuration names.
WHEELS=(pytest pytest-xdist pytest-timeout pytest-asyncio psutil gguf "llguidance>=1.0,<2" prometheus_client
        "compressed-tensors>=0.20" pydantic loguru)  # fmt: skip

if [ "${1:-}" = download ]; then
  set -euo pipefail
  mkdir -p .whl
  python -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any -d .whl "${WHEELS[@]}" \
    --no-deps
  python -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d .whl execnet pluggy iniconfig pydantic-core \
    annotated-types typing-inspection --no-deps
  ls .whl
else
  site=/tmp/vlchat-site
  shim=/tmp/vlchat-shim
  if [ ! -d "$site" ]; then
    python -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl || echo "device_setup: wheel install failed"
  fi
  mkdir -p "$shim" && ln -sfn "$PWD" "$shim/vlchat"
  # PYTHONPATH comes before site-packages: .whl holds none of the machine's own torch/triton/transformers
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$shim:$site"
  export PATH="$site/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  python -c "import vlchat.llm, pytest; print('device_setup: vlchat from', vlchat.llm.__file__.rsplit('/', 2)[0])"
fi
