"""pyproject.toml lists every subpackage of the folders that install as `vlchat.*` (setuptools ships only
the packages it names), and the package data the app needs at run time."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed():
    config = _setuptools()
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *relative)))
    listed = set(config["packages"])
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found <= {"vlchat.assets", "vlchat.assets.examples"}  # data folders, no code


def test_package_data_covers_the_demo_model_and_templates():
    data = _setuptools()["package-data"]
    demo = {p.name for p in (REPO / "assets" / "demo-model").iterdir()}
    assert "demo-model/*" in data["vlchat.assets"] and {"config.json", "model.safetensors"} <= demo
    assert "*.jinja" in data["vlchat.llm.chat_templates"]
