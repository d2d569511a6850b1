"""Conversations about two or three images sent in one message, and follow-ups several turns deep.

Every answer in such a conversation names its image ("In the first image, there is one shape."),
so a follow-up can be checked for staying with the right image: "And the second image?" repeats
the last question about that image; "And the red circle?" continues on the image last talked about.
"""

from __future__ import annotations

import random

from scripts.demo.conversation import (
    Turn,
    _target,
    answer_color,
    answer_count,
    answer_describe,
    answer_exists,
    answer_shapes,
    answer_where,
    article,
    ask,
    follow_up,
)
from scripts.demo.shapes import KINDS, Scene

ORDINALS = ("first", "second", "third")
EVERY_IMAGE = {  # one question about all the images
    "count": ("How many shapes are in each image?", "How many shapes are there?", "Count the shapes in each image.",
              "How many shapes are in these images?"),
    "shapes": ("What shapes are in the images?", "What shapes are in each image?", "What do you see in these images?",
               "What shapes are there?", "What is in the images?"),
    "describe": ("Describe the images.", "Describe these pictures.", "What do the images show?",
                 "Describe each image."),
}  # fmt: skip
ONE_IMAGE = {  # a question about one of them
    "count": ("How many shapes are in the {o} image?", "How many shapes does the {o} image have?"),
    "shapes": ("What shapes are in the {o} image?", "What is in the {o} image?"),
    "describe": ("Describe the {o} image.", "What does the {o} image show?"),
    "color": ("What color is the {kind} in the {o} image?", "Which color is the {kind} in the {o} image?"),
    "exists": ("Is there {a} {color} {kind} in the {o} image?", "Does the {o} image contain {a} {color} {kind}?"),
    "where": ("Where is the {color} {kind} in the {o} image?", "In the {o} image, where is the {color} {kind}?"),
}
OTHER_IMAGE = ("And the {o} image?", "What about the {o} image?", "And in the {o} image?")
MULTI_TYPES = ("every", "one", "other", "followup")


def about(answer: str, index: int) -> str:
    """A single-image answer said of image `index` ("In the second image, the circle is red.")."""
    ordinal = ORDINALS[index]
    if answer.startswith("The image shows"):
        return f"The {ordinal} image shows" + answer[len("The image shows") :]
    answer = answer.replace(" in the image", "")
    first = answer if answer.startswith("I ") else answer[0].lower() + answer[1:]
    return f"In the {ordinal} image, {first}"


def _answer(scene: Scene, qtype: str, params: dict) -> str:
    if qtype == "count":
        return answer_count(scene)
    if qtype == "shapes":
        return answer_shapes(scene)
    if qtype == "describe":
        return answer_describe(scene)
    if qtype == "color":
        return answer_color(scene, params["kind"])
    if qtype == "exists":
        return answer_exists(scene, params["color"], params["kind"])
    return answer_where(scene, params["color"], params["kind"])


def _params(scene: Scene, qtype: str, rng: random.Random) -> dict:
    if qtype == "color":
        present = sorted({s.kind for s in scene.shapes})
        return {"kind": rng.choice(present) if rng.random() < 0.85 else rng.choice(KINDS)}
    if qtype in ("exists", "where"):
        color, kind = _target(scene, rng, 0.5 if qtype == "exists" else 0.1)
        return {"color": color, "kind": kind, "a": article(color)}
    return {}


class MultiDialogue:
    """The state of one conversation about `scenes`: which image and which question came last."""

    def __init__(self, scenes: list[Scene], rng: random.Random):
        self.scenes, self.rng = scenes, rng
        self.index: int | None = None  # the image the last question was about (None: all of them)
        self.qtype: str | None = None
        self.last: Turn | None = None

    def every(self) -> Turn:
        qtype = self.rng.choice(list(EVERY_IMAGE))
        answer = " ".join(about(_answer(s, qtype, {}), i) for i, s in enumerate(self.scenes))
        self.index, self.qtype = None, qtype
        return self._said(Turn(self.rng.choice(EVERY_IMAGE[qtype]), answer, "multi"))

    def one(self, index: int | None = None, qtype: str | None = None) -> Turn:
        index = self.rng.randrange(len(self.scenes)) if index is None else index
        qtype = qtype or self.rng.choice(list(ONE_IMAGE))
        params = _params(self.scenes[index], qtype, self.rng)
        question = self.rng.choice(ONE_IMAGE[qtype]).format(o=ORDINALS[index], **params)
        self.index, self.qtype = index, qtype
        return self._said(Turn(question, about(_answer(self.scenes[index], qtype, params), index), "multi_one"))

    def other(self) -> Turn | None:
        """The last question again, about another image."""
        if self.qtype not in EVERY_IMAGE or self.index is None:
            return None
        index = self.rng.choice([i for i in range(len(self.scenes)) if i != self.index])
        answer = about(_answer(self.scenes[index], self.qtype, {}), index)
        self.index = index
        return self._said(Turn(self.rng.choice(OTHER_IMAGE).format(o=ORDINALS[index]), answer, "followup"))

    def elliptical(self) -> Turn | None:
        """ "And the square?" after a colour, exists or where question: about the same image."""
        if self.index is None or self.last is None or self.qtype not in ("color", "exists", "where"):
            return None
        turn = follow_up(self.scenes[self.index], Turn(self.last.question, "", self.qtype), self.rng)
        if turn is None:
            return None
        return self._said(Turn(turn.question, about(turn.answer, self.index), "followup"))

    def _said(self, turn: Turn) -> Turn:
        self.last = turn
        return turn


def multi_dialogue(scenes: list[Scene], rng: random.Random, max_turns: int = 4) -> list[Turn]:
    """1 to max_turns turns about 2-3 images that all came with the first message."""
    talk = MultiDialogue(scenes, rng)
    turns = [talk.every() if rng.random() < 0.5 else talk.one()]
    for _ in range(rng.randint(1, max_turns) - 1):
        r = rng.random()
        turn = talk.other() if r < 0.35 else talk.elliptical() if r < 0.6 else None
        turns.append(turn or (talk.every() if rng.random() < 0.3 else talk.one()))
    return turns


def deep_follow_ups(scene: Scene, rng: random.Random, depth: int = 3) -> list[Turn]:
    """A colour, exists or where question on one image, then elliptical follow-ups until `depth` turns."""
    first = ask(scene, rng.choice(("color", "exists", "where")), rng)
    return [first, *(follow_up(scene, first, rng) for _ in range(depth - 1))]
