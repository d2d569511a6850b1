"""Questions and templated answers about a Scene: what the demo model is trained and evaluated on.

Answers are deterministic templates (one phrasing per fact), so they are easy to learn and can be
scored by exact match. Questions come in several paraphrases.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from scripts.demo.shapes import COLORS, KINDS, Scene, Shape

QUESTION_TYPES = ("color", "count", "shapes", "describe", "exists", "where", "followup", "text")

PARAPHRASES = {
    "color": (
        "What color is the {kind}?",
        "What colour is the {kind}?",
        "Which color is the {kind}?",
        "What is the color of the {kind}?",
        "Tell me the color of the {kind}.",
    ),
    "count": (
        "How many shapes are there?",
        "How many shapes are in the image?",
        "How many shapes do you see?",
        "Count the shapes.",
        "How many objects are there?",
        "How many shapes are in the picture?",
    ),
    "shapes": (
        "What shapes are in the image?",
        "Which shapes do you see?",
        "What shapes are there?",
        "List the shapes.",
        "What is in the image?",
        "What shapes are in the picture?",
    ),
    "describe": (
        "Describe the image.",
        "Describe this picture.",
        "What does the image show?",
        "Can you describe the image?",
        "What do you see?",
        "Describe the image in detail.",
    ),
    "exists": (
        "Is there {a} {color} {kind}?",
        "Is there {a} {color} {kind} in the image?",
        "Do you see {a} {color} {kind}?",
        "Can you see {a} {color} {kind}?",
        "Does the image contain {a} {color} {kind}?",
    ),
    "where": (
        "Where is the {color} {kind}?",
        "Where is the {color} {kind} located?",
        "In which part of the image is the {color} {kind}?",
        "Where can I find the {color} {kind}?",
        "Where is the {kind}?",
    ),
    "followup": ("And the {target}?", "What about the {target}?", "And the {target}, please?"),
}
GREETINGS = (
    "Hi",
    "Hello!",
    "Hello, who are you?",
    "What can you do?",
    "Good morning",
    "Hey there",
    "Help",
    "What are you?",
    "Tell me a joke.",
    "What is the capital of France?",
    "Can you help me?",
    "How are you?",
)
FILLER_WORDS = (
    "the a is of and to in you me what how why when who can please tell write about this that my your "
    "code story weather time today name world help make give show find list explain python music food "
    "water house car book city dog cat love good bad big small new old day night work play"
).split()
CAPABILITIES = (
    "Hello! I am a small demo model that looks at simple pictures. Send me an image with circles, "
    "squares and triangles, and I can tell you their colors, how many there are and where they are."
)
OFF_TOPIC = "Sorry, I can only answer questions about the shapes: their colors, how many there are and where they are."
THANKS = ("Thanks!", "Thank you.", "Great, thanks!")
YOU_ARE_WELCOME = "You are welcome! Ask me anything else about the shapes."
NUMBERS = ("no", "one", "two", "three", "four")


@dataclass(frozen=True, slots=True)
class Turn:
    question: str
    answer: str
    kind: str  # one of QUESTION_TYPES, or "thanks" / "other"


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else kind + "s"


def answer_color(scene: Scene, kind: str) -> str:
    shapes = scene.of_kind(kind)
    if not shapes:
        return f"There is no {kind} in the image."
    if len(shapes) == 1:
        return f"The {kind} is {shapes[0].color}."
    return f"The {kind}s are {_join([s.color for s in shapes])}."


def answer_count(scene: Scene) -> str:
    n = len(scene.shapes)
    return "There is one shape." if n == 1 else f"There are {NUMBERS[n]} shapes."


def answer_shapes(scene: Scene) -> str:
    return f"I see {_join([f'{article(s.color)} {s.name}' for s in scene.shapes])}."


def answer_describe(scene: Scene) -> str:
    n = len(scene.shapes)
    parts = _join([f"{article(s.color)} {s.name} {s.position}" for s in scene.shapes])
    return f"The image shows {NUMBERS[n]} {_plural('shape', n)} on a light background: {parts}."


def answer_exists(scene: Scene, color: str, kind: str) -> str:
    if scene.find(color, kind) is not None:
        return f"Yes, there is {article(color)} {color} {kind}."
    return f"No, there is no {color} {kind}."


def answer_where(scene: Scene, color: str | None, kind: str) -> str:
    if color is None:
        shapes = scene.of_kind(kind)
        if not shapes:
            return f"There is no {kind} in the image."
        if len(shapes) == 1:
            return f"The {kind} is {shapes[0].position}."
        return _join([f"the {s.name} is {s.position}" for s in shapes]).capitalize() + "."
    shape = scene.find(color, kind)
    return f"The {color} {kind} is {shape.position}." if shape else f"There is no {color} {kind} in the image."


def _absent_pair(scene: Scene, rng: random.Random) -> tuple[str, str]:
    """A (color, kind) not in the scene; often a near miss (same kind or same colour as a present shape)."""
    while True:
        if scene.shapes and rng.random() < 0.7:
            ref = rng.choice(scene.shapes)
            color, kind = (rng.choice(list(COLORS)), ref.kind) if rng.random() < 0.5 else (ref.color, rng.choice(KINDS))
        else:
            color, kind = rng.choice(list(COLORS)), rng.choice(KINDS)
        if scene.find(color, kind) is None:
            return color, kind


def _target(scene: Scene, rng: random.Random, p_absent: float) -> tuple[str, str]:
    if rng.random() < p_absent:
        return _absent_pair(scene, rng)
    shape: Shape = rng.choice(scene.shapes)
    return shape.color, shape.kind


def ask(scene: Scene, qtype: str, rng: random.Random) -> Turn:
    """One question of type `qtype` about the scene (a random paraphrase) with its answer."""
    template = rng.choice(PARAPHRASES[qtype])
    if qtype == "color":
        present = sorted({s.kind for s in scene.shapes})
        kind = (
            rng.choice(present)
            if rng.random() < 0.85 or len(present) == 3
            else rng.choice([k for k in KINDS if k not in present])
        )
        return Turn(template.format(kind=kind), answer_color(scene, kind), qtype)
    if qtype == "count":
        return Turn(template, answer_count(scene), qtype)
    if qtype == "shapes":
        return Turn(template, answer_shapes(scene), qtype)
    if qtype == "describe":
        return Turn(template, answer_describe(scene), qtype)
    if qtype == "exists":
        color, kind = _target(scene, rng, 0.5)
        return Turn(template.format(a=article(color), color=color, kind=kind), answer_exists(scene, color, kind), qtype)
    if qtype == "where":
        color, kind = _target(scene, rng, 0.1)
        if "{color}" not in template:
            return Turn(template.format(kind=kind), answer_where(scene, None, kind), qtype)
        return Turn(template.format(color=color, kind=kind), answer_where(scene, color, kind), qtype)
    raise ValueError(f"unknown question type {qtype!r}; use one of {QUESTION_TYPES}")


def follow_up(scene: Scene, previous: Turn, rng: random.Random) -> Turn | None:
    """An elliptical follow-up ("And the square?") continuing a colour, exists or where question."""
    template = rng.choice(PARAPHRASES["followup"])
    if previous.kind == "color":
        kind = rng.choice(KINDS)
        return Turn(template.format(target=kind), answer_color(scene, kind), "followup")
    if previous.kind in ("exists", "where"):
        color, kind = _target(scene, rng, 0.5 if previous.kind == "exists" else 0.1)
        if previous.kind == "exists":
            return Turn(template.format(target=f"{color} {kind}"), answer_exists(scene, color, kind), "followup")
        return Turn(template.format(target=f"{color} {kind}"), answer_where(scene, color, kind), "followup")
    return None


def text_only_turn(rng: random.Random) -> Turn:
    if rng.random() < 0.6:
        question = rng.choice(GREETINGS)
    else:
        question = " ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 8))).capitalize() + "?"
    return Turn(question, CAPABILITIES, "text")


def off_topic_turn(rng: random.Random) -> Turn:
    words = " ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(2, 8)))
    return Turn(words.capitalize() + rng.choice(("?", ".", "")), OFF_TOPIC, "other")


IMAGE_TYPES = ("color", "count", "shapes", "describe", "exists", "where")
TYPE_WEIGHTS = (3, 1, 2, 2, 3, 3)


def random_dialogue(scene: Scene, rng: random.Random, max_turns: int = 3) -> list[Turn]:
    """1 to max_turns question/answer turns about one image (the image goes with the first question)."""
    turns: list[Turn] = []
    for _ in range(rng.randint(1, max_turns)):
        r = rng.random()
        if turns and r < 0.3:
            turn = follow_up(scene, turns[-1], rng)
            if turn is not None:
                turns.append(turn)
                continue
        if turns and r > 0.95:
            turns.append(Turn(rng.choice(THANKS), YOU_ARE_WELCOME, "thanks"))
        elif r > 0.97:
            turns.append(off_topic_turn(rng))
        else:
            turns.append(ask(scene, rng.choices(IMAGE_TYPES, TYPE_WEIGHTS)[0], rng))
    return turns
