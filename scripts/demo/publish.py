"""Install a training run's output (scripts.demo.train --out DIR) as the shipped demo model.

    python -m scripts.demo.publish DIR

Merges the weight shards into assets/demo-model/model.safetensors, records the training run and its
evaluation in assets/demo-model/vlchat.json (trained: true) and copies the loss curve to docs/.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from scripts.demo.build import MODEL_DIR

DOCS_DIR = MODEL_DIR.parents[1] / "docs"


def publish(run_dir: Path, model_dir: Path = MODEL_DIR, docs_dir: Path = DOCS_DIR) -> dict:
    shards = sorted(run_dir.glob("model-*-of-*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no model-*-of-*.safetensors in {run_dir}; run scripts.demo.train --out {run_dir}")
    tensors = {}
    for shard in shards:
        tensors.update(load_file(shard))
    save_file(tensors, model_dir / "model.safetensors", {"format": "pt"})
    results = json.loads((run_dir / "results.json").read_text())
    info = {
        "name": "vlchat-demo",
        "trained": True,
        "device": results["device"],
        "train": results["config"] | results["stats"],
        "eval_transformers": results.get("eval"),
    }
    (model_dir / "vlchat.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.copyfile(run_dir / "loss.png", docs_dir / "demo-loss.png")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    info = publish(parser.parse_args().run_dir)
    print(json.dumps(info["eval_transformers"], indent=1))


if __name__ == "__main__":
    main()
