"""`LLM.generate` passes per-request image options to the vision model (here the demo LLaVA)."""

import pytest

from scripts.demo.build import MODEL_DIR
from scripts.demo.examples import EXAMPLES_DIR
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.errors import InvalidRequestError

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.png"))


@pytest.fixture(scope="module")
def llm():
    engine = LLM(str(MODEL_DIR), num_blocks=64)
    yield engine
    engine.close()


def test_max_images_per_request(llm):
    conv = [{"role": "user", "content": [{"type": "image", "image": str(p)} for p in EXAMPLES[:2]]
             + [{"type": "text", "text": "How many shapes are there?"}]}]  # fmt: skip
    with pytest.raises(InvalidRequestError, match="image"):
        llm.generate([conv], SamplingParams(max_tokens=4), mm_options={"max_images": 1})
    assert llm.engine.num_free_blocks() == 64 and not llm.engine.has_unfinished()
    one = [{"role": "user", "content": [{"type": "image", "image": str(EXAMPLES[0])},
                                        {"type": "text", "text": "How many shapes are there?"}]}]  # fmt: skip
    out = llm.generate([one], SamplingParams(max_tokens=12, temperature=0), mm_options={"max_images": 1})[0]
    assert out.finish_reason in ("stop", "length") and out.text.strip()
