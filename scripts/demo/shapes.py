"""Synthetic scenes for the demo model: 1 to 3 coloured shapes on a light background.

A scene lives on a 3 x 3 grid: each shape sits inside its own cell, so shapes never overlap and
every shape has one unambiguous position word ("top left", "center", ...). Sizes and offsets inside
the cell vary; a shape is at least a sixth of the image side.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

KINDS = ("circle", "square", "triangle")
COLORS = {
    "red": (215, 35, 35),
    "orange": (245, 140, 20),
    "yellow": (240, 205, 25),
    "green": (40, 165, 60),
    "blue": (40, 85, 225),
    "purple": (140, 60, 180),
}
# Row-major 3 x 3 grid cells, phrased as the answer to "Where is the X?".
POSITIONS = (
    "at the top left",
    "at the top",
    "at the top right",
    "on the left",
    "in the center",
    "on the right",
    "at the bottom left",
    "at the bottom",
    "at the bottom right",
)
MIN_SIZE = 1 / 6 + 0.005  # of the image side
MAX_SIZE = 0.30
CELL = 1 / 3
MARGIN = 0.01


@dataclass(frozen=True, slots=True)
class Shape:
    kind: str  # one of KINDS
    color: str  # one of COLORS
    cell: int  # 0..8, row-major in the 3 x 3 grid
    cx: float  # centre, fraction of the image side
    cy: float
    size: float  # bounding-box side, fraction of the image side

    @property
    def position(self) -> str:
        return POSITIONS[self.cell]

    @property
    def name(self) -> str:
        return f"{self.color} {self.kind}"


@dataclass(frozen=True, slots=True)
class Scene:
    shapes: tuple[Shape, ...]  # in reading order (by cell)
    background: tuple[int, int, int]

    def of_kind(self, kind: str) -> list[Shape]:
        return [s for s in self.shapes if s.kind == kind]

    def find(self, color: str, kind: str) -> Shape | None:
        return next((s for s in self.shapes if s.color == color and s.kind == kind), None)


def random_scene(rng: random.Random, num_shapes: int | None = None) -> Scene:
    """Draw a scene; no two shapes share both colour and kind, so "the red circle" is always unique."""
    n = num_shapes if num_shapes is not None else rng.randint(1, 3)
    cells = sorted(rng.sample(range(9), n))
    used: set[tuple[str, str]] = set()
    shapes = []
    for cell in cells:
        while True:
            kind, color = rng.choice(KINDS), rng.choice(list(COLORS))
            if (color, kind) not in used:
                used.add((color, kind))
                break
        size = rng.uniform(MIN_SIZE, MAX_SIZE)
        row, col = divmod(cell, 3)
        slack = CELL - size - 2 * MARGIN
        cx = col * CELL + MARGIN + size / 2 + rng.uniform(0, slack)
        cy = row * CELL + MARGIN + size / 2 + rng.uniform(0, slack)
        shapes.append(Shape(kind, color, cell, cx, cy, size))
    base = rng.randint(228, 252)
    background = tuple(min(255, base + rng.randint(-6, 6)) for _ in range(3))
    return Scene(tuple(shapes), background)


def _jitter(rgb: tuple[int, int, int], rng: random.Random, amount: int) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in rgb)


def render(scene: Scene, size: int = 112, rng: random.Random | None = None) -> Image.Image:
    """Draw the scene as an RGB image of `size` x `size` pixels (colours jittered when rng is given)."""
    image = Image.new("RGB", (size, size), scene.background)
    draw = ImageDraw.Draw(image)
    for shape in scene.shapes:
        fill = _jitter(COLORS[shape.color], rng, 14) if rng is not None else COLORS[shape.color]
        half = shape.size * size / 2
        x, y = shape.cx * size, shape.cy * size
        box = (x - half, y - half, x + half, y + half)
        if shape.kind == "circle":
            draw.ellipse(box, fill=fill)
        elif shape.kind == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x, y - half), (x + half, y + half), (x - half, y + half)], fill=fill)
    return image


def render_for_model(scene: Scene, rng: random.Random, size: int = 112) -> Image.Image:
    """Render at the model's size, or larger and downscaled (as an uploaded picture would be)."""
    scale = rng.choice((1, 1, 1, 2, 3))
    if scale == 1:
        return render(scene, size, rng)
    big = render(scene, size * scale + rng.randint(-4, 4) * scale, rng)
    return big.resize((size, size), Image.BICUBIC)
