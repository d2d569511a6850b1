"""Which model the app serves: a local directory, a Hub id from the local cache, or the embedded demo model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vlchat.app.errors import ConfigError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEMO_MODEL = ASSETS / "demo-model"
EXAMPLES = ASSETS / "examples"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
# What a Hugging Face model directory holds besides config.json (any one name of each kind).
REQUIRED_FILES = {
    "weights (*.safetensors or pytorch_model*.bin)": ("*.safetensors", "pytorch_model*.bin"),
    "tokenizer (tokenizer.json, tokenizer.model or vocab.json)": ("tokenizer.json", "tokenizer.model", "vocab.json",
                                                                  "tokenizer_config.json"),
}  # fmt: skip


@dataclass(slots=True)
class ModelChoice:
    path: str
    name: str
    untrained: bool = False
    demo: bool = False
    example_dirs: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        label = f"model {self.name}"
        if self.untrained:
            label += " (UNTRAINED demo weights: answers are random text)"
        return label

    def example_images(self) -> list[Path]:
        return sorted(p for d in self.example_dirs if d.is_dir() for p in d.iterdir() if p.suffix in IMAGE_SUFFIXES)


def resolve_model(model: str | None, served_name: str | None = None) -> ModelChoice:
    """A ModelChoice for `--model` (None: the demo model in assets/)."""
    if model is None:
        if not (DEMO_MODEL / "config.json").is_file():
            raise ConfigError(f"the demo model is missing from {DEMO_MODEL}; pass --model DIR")
        meta = _demo_meta(DEMO_MODEL)
        untrained = not meta.get("trained", True)
        return ModelChoice(str(DEMO_MODEL), served_name or meta.get("name", "vlchat-demo"), untrained, True, [EXAMPLES])
    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":  # config, tokenizer and weights in one file (llm/gguf.py)
        return ModelChoice(str(path), served_name or path.stem, False, False, [EXAMPLES])
    if path.is_file():
        raise ConfigError(f"{path} is a file but not a .gguf checkpoint; --model takes a Hugging Face model "
                          "directory, a Hub id (owner/name) or a .gguf file")  # fmt: skip
    if not path.is_dir():
        path = _from_hub_cache(model)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} has no config.json; --model takes a Hugging Face model directory, a Hub id or a "
                          ".gguf file")  # fmt: skip
    missing = [what for what, names in REQUIRED_FILES.items() if not any(any(path.glob(n)) for n in names)]
    if missing:
        raise ConfigError(f"{path} has a config.json but no {' and no '.join(missing)}; copy the whole model "
                          "directory as saved by transformers (save_pretrained) or pass a .gguf file")  # fmt: skip
    meta = _demo_meta(path)
    untrained = meta.get("trained", True) is False
    return ModelChoice(str(path), served_name or meta.get("name") or path.name, untrained, False, [EXAMPLES])


def start_engine(model: ModelChoice, engine_options: dict):
    """Build the AsyncEngine for `model`; engine options go to the engine config as given."""
    from vlchat.llm import AsyncEngine, EngineConfig

    options = {k: v for k, v in engine_options.items() if v is not None}
    options.setdefault("served_model_name", model.name)
    return AsyncEngine.from_config(EngineConfig.from_options(model.path, **options))


def _demo_meta(path: Path) -> dict:
    try:
        return json.loads((path / "vlchat.json").read_text())
    except (OSError, ValueError):
        return {}


def _from_hub_cache(model_id: str) -> Path:
    if model_id.count("/") != 1 or model_id.startswith((".", "/")):
        raise ConfigError(f"--model {model_id!r} is neither a directory nor a Hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id))  # honours HF_HUB_OFFLINE (then: the local cache only)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"could not get {model_id!r} from the Hugging Face Hub ({reason})") from None
