"""The end-to-end checks every vision-language family runs against transformers (see test_<family>.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoProcessor

from tests.vision.references import conversations, hf_generate, hf_inputs_for, image, our_prompt_logits, rel_err
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.weights import load_model

RTOL = 1e-4
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


class FamilyChecks:
    """Per family: its transformers class and its key for `references.hf_inputs_for`."""

    def __init__(self, hf_class, inputs_family: str) -> None:
        self.hf_class = hf_class
        self.inputs_family = inputs_family
        self._references: dict = {}

    def hf_inputs(self, prompt) -> dict:
        return hf_inputs_for(self.inputs_family, prompt)

    def setup_family(self, model_dir):
        processor = AutoProcessor.from_pretrained(model_dir)
        ours = load_model(model_dir, dtype=torch.float32, progress=False)
        hf = self.hf_class.from_pretrained(model_dir, dtype=torch.float32).eval()
        return processor, ours, hf

    def reference(self, family, conv):
        """(our prompt, transformers' greedy tokens, its prompt logits), memoized per conversation."""
        processor, ours, hf = family
        prompt = type(ours).process_prompt(processor, conv, {})
        key = (id(hf), tuple(prompt.token_ids), tuple(i.hash for i in prompt.images))
        if key not in self._references:
            self._references[key] = hf_generate(hf, self.hf_inputs(prompt), NEW_TOKENS)
        return (prompt, *self._references[key])


def module_fixtures(checks: FamilyChecks, make_model_dir):
    """A family test module's `model_dir`, `family` and `llm` fixtures (module scope):
    `model_dir, family, llm = module_fixtures(...)` at the module's top level."""

    @pytest.fixture(scope="module")
    def model_dir(tmp_path_factory):
        return make_model_dir(tmp_path_factory.mktemp(checks.inputs_family))

    @pytest.fixture(scope="module")
    def family(model_dir):
        return checks.setup_family(model_dir)

    @pytest.fixture(scope="module")
    def llm(model_dir):
        return family_llm(model_dir)

    return model_dir, family, llm


def family_llm(model_dir) -> LLM:
    """The engine the family checks run: fp32 on CPU, 128 KV blocks of 8 tokens."""
    return LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=128, block_size=8)


def check_logits(checks: FamilyChecks, family, name: str) -> None:
    processor, ours, hf = family
    prompt, tokens, expected = checks.reference(family, conversations(image)[name])
    assert len(prompt.images) == {"one_image": 1, "two_images": 2, "second_turn": 1, "text_only": 0}[name]
    got = our_prompt_logits(ours, prompt)
    assert rel_err(got, expected) < RTOL
    assert len(set(tokens)) > 2, "the reference continuation should not be degenerate"


def check_llm_batch(checks: FamilyChecks, family, llm: LLM) -> None:
    """A batch mixing text-only and image requests gives each its transformers tokens."""
    convs = conversations(image)
    names = ["one_image", "text_only", "two_images", "second_turn"]
    expected = [checks.reference(family, convs[n])[1] for n in names]
    outputs = llm.generate([convs[n] for n in names], GREEDY)
    assert [list(o.token_ids) for o in outputs] == expected


def check_prefix_cache_separates_images(checks: FamilyChecks, family, llm: LLM) -> None:
    """The same text with another image hits no cached block past the image; the same image does."""
    processor, ours, _ = family
    conv = conversations(image)["one_image"]
    llm.generate([conv], GREEDY)
    other = [{**conv[0], "content": [{"type": "image", "image": image(9)}, conv[0]["content"][1]]}]
    engine = llm.engine
    bs = engine.block_manager.block_size

    def hits(c) -> tuple[int, object]:
        prompt = type(ours).process_prompt(processor, c, {})
        seq = Sequence("probe", prompt, GREEDY, bs)
        return len(engine.block_manager.match_prefix(seq)), prompt

    same_hits, prompt = hits(conv)
    other_hits, _ = hits(other)
    assert same_hits >= len(prompt.token_ids) // bs - 1 > 0
    assert other_hits <= prompt.images[0].offset // bs
    expected = checks.reference(family, other)[1]
    assert list(llm.generate([other], GREEDY)[0].token_ids) == expected


def check_embeddings_cached(llm: LLM) -> None:
    """An image seen before (another turn of the conversation) is not encoded again."""
    model = llm.engine.runner.model
    calls = []
    original = model.embed_multimodal
    model.embed_multimodal = lambda datas: calls.append(len(datas)) or original(datas)
    try:
        img = image(11)
        first = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "Hi"}]}]
        llm.generate([first], GREEDY)
        llm.engine.block_manager.enable_prefix_caching = False  # force a recompute that needs the embeddings
        follow = [*first, {"role": "assistant", "content": "Ok."}, {"role": "user", "content": "More?"}]
        llm.generate([follow], GREEDY)
    finally:
        llm.engine.block_manager.enable_prefix_caching = True
        model.embed_multimodal = original
    assert calls == [1]


def check_image_limit(llm: LLM) -> None:
    conv = conversations(image)["two_images"]
    with pytest.raises(InvalidRequestError, match="at most 1 images"):
        llm.engine.add_request("limit", conv, GREEDY, {"max_images": 1})


def relayout(src, dst, rename) -> None:
    """A copy of the model directory `src` at `dst` whose weight names are `rename`d (other checkpoint layouts)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    save_file({rename(k): v for k, v in load_file(src / "model.safetensors").items()}, dst / "model.safetensors")
