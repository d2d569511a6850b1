"""Where every benchmark's results go: `<stem>.json`, and `<stem>.md` rendered from it (also printed)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def save_results(stem: str | os.PathLike, result: dict, render: Callable[[dict], str] | None = None) -> None:
    """Write `stem`.json (creating its folder); with `render`, then `stem`.md (render_results). The JSON is
    written first, so a partial result survives a failing or interrupted render."""
    stem = os.fspath(stem)
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    if render is not None:
        render_results(stem, result, render)


def render_results(stem: str | os.PathLike, result: dict, render: Callable[[dict], str]) -> None:
    """Write `stem`.md = render(result) and print it."""
    text = render(result)
    with open(os.fspath(stem) + ".md", "w") as f:
        f.write(text)
    print(text)
