"""Example images for the UI (assets/examples/): fixed scenes drawn at 3x the model's input size."""

from __future__ import annotations

from pathlib import Path

from scripts.demo.shapes import Scene, Shape, render

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "assets" / "examples"
EXAMPLES = {
    "three-shapes": Scene(
        (
            Shape("circle", "red", 0, 0.17, 0.16, 0.24),
            Shape("square", "blue", 4, 0.52, 0.49, 0.22),
            Shape("triangle", "yellow", 8, 0.82, 0.83, 0.26),
        ),
        (240, 240, 236),
    ),
    "two-shapes": Scene(
        (Shape("triangle", "green", 2, 0.83, 0.18, 0.25), Shape("circle", "purple", 6, 0.2, 0.8, 0.2)),
        (245, 243, 238),
    ),
    "one-shape": Scene((Shape("square", "orange", 3, 0.16, 0.5, 0.27),), (236, 240, 244)),
    "two-circles": Scene(
        (Shape("circle", "blue", 1, 0.5, 0.17, 0.22), Shape("circle", "yellow", 7, 0.47, 0.83, 0.2)),
        (242, 242, 242),
    ),
}


def main(scale: int = 3) -> None:
    EXAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    for name, scene in EXAMPLES.items():
        render(scene, 112 * scale).save(EXAMPLES_DIR / f"{name}.png", optimize=True)
    print(f"wrote {len(EXAMPLES)} examples to {EXAMPLES_DIR}")


if __name__ == "__main__":
    main()
