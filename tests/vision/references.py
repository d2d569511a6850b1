"""What the vision tests compare: conversations, test images, transformers' outputs and ours for one prompt."""

from __future__ import annotations

import torch
from PIL import Image

from tests.llm.tiny import rel_err  # noqa: F401 - the vision tests' comparisons import it from here


def image(seed: int, size: tuple[int, int] = (56, 28)) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def hf_generate(model, inputs: dict, max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of the transformers VLM (full recompute each step, no EOS stop) and its prompt logits."""
    ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items() if k != "input_ids"}
    out = []
    with torch.no_grad():
        for step in range(max_new_tokens):
            logits = model(input_ids=ids, **extra).logits[0]
            if step == 0:
                prompt_logits = logits
            out.append(int(logits[-1].argmax()))
            ids = torch.cat([ids, torch.tensor([[out[-1]]], device=ids.device)], dim=1)
            if "mm_token_type_ids" in extra:  # M-RoPE models: the new token is text
                types = extra["mm_token_type_ids"]
                extra["mm_token_type_ids"] = torch.cat([types, types.new_zeros(1, 1)], 1)
    return out, prompt_logits


def hf_inputs_for(family: str, prompt, device="cpu") -> dict:
    """The transformers model's inputs for one of our prompts (the same token ids and pixels)."""
    ids = torch.tensor([prompt.token_ids])
    inputs = {"input_ids": ids}
    images = [i.data for i in prompt.images]
    if images and family in ("llava", "internvl"):
        inputs["pixel_values"] = torch.cat([d["pixel_values"] for d in images])
    elif images and family == "llava-next":
        tiles = max(d["pixel_values"].shape[0] for d in images)
        pad = [
            torch.nn.functional.pad(d["pixel_values"], (0,) * 6 + (0, tiles - d["pixel_values"].shape[0]))
            for d in images
        ]
        inputs["pixel_values"] = torch.stack(pad)
        inputs["image_sizes"] = torch.cat([d["image_sizes"] for d in images])
    elif images and family.startswith("qwen"):
        inputs["pixel_values"] = torch.cat([d["pixel_values"] for d in images])
        inputs["image_grid_thw"] = torch.cat([d["image_grid_thw"] for d in images])
        inputs["mm_token_type_ids"] = (ids == prompt.token_ids[prompt.images[0].offset]).int()
    return {k: v.to(device) for k, v in inputs.items()}


@torch.no_grad()
def our_prompt_logits(model, prompt, device="cpu") -> torch.Tensor:
    """Prompt logits [tokens, vocab] of our model over one prefill (images embedded as the runner does)."""
    from tests.llm.paged import PagedCache
    from vlchat.llm.engine.context import use_context

    with torch.device(device):
        blocks = len(prompt.token_ids) // 4 + 2  # PagedCache's blocks hold 4 tokens
        cache = PagedCache(model, num_blocks=blocks, dtype=model.language_model.model.embed_tokens.weight.dtype)
        meta, positions = cache.metadata([(0, prompt.token_ids)])
    if prompt.mrope_positions is not None:
        positions = prompt.mrope_positions.to(device)
    ids = torch.tensor(prompt.token_ids, device=device)
    embeds = model.get_input_embeddings(ids).clone()
    if prompt.images:
        for item, emb in zip(prompt.images, model.embed_multimodal([i.data for i in prompt.images]), strict=True):
            embeds[item.offset : item.end] = emb
    with use_context(meta):
        hidden = model(ids, positions, inputs_embeds=embeds)
    return model.compute_logits(hidden)


def conversations(img) -> dict[str, list]:
    """The conversations every family is tested on (`img(i)` gives the i-th test image)."""
    return {
        "one_image": [
            {"role": "user", "content": [{"type": "image", "image": img(1)}, {"type": "text", "text": "What is this?"}]}
        ],
        "two_images": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare"},
                    {"type": "image", "image": img(2)},
                    {"type": "text", "text": "and"},
                    {"type": "image", "image": img(3)},
                ],
            }
        ],
        "second_turn": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hello! How are you?"},
            {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image", "image": img(4)}]},
        ],
        "text_only": [{"role": "user", "content": "Tell me about the quick brown fox."}],
    }
