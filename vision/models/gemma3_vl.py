"""Gemma 3 vision-language models (Gemma3ForConditionalGeneration: the 4B, 12B and 27B checkpoints).

A SigLIP tower (vision/encoders/clip.py, all layers, then its post-LayerNorm), Gemma 3's projector
(average pooling of the patch grid down to `mm_tokens_per_image` tokens, a (1 + w) RMSNorm, one
matrix), and the Gemma 3 text decoder (llm/models/gemma3.py). The processor and its chat template
come from transformers; each image becomes one run of `<image_soft_token>` placeholders.

Bidirectional image attention: inside the causal decoder the tokens of one image see each other
in both directions (transformers: causal OR same-image, AND the sliding window on local layers).
The paged kernels are causal, so on a prefill step whose new tokens hold an image run the decoder's
attention layers recompute the rows of that run over the cached keys with that mask
(`ImageRunAttention`, plain torch: one small attention per image run and layer). The run's K/V
must all be written in that step: a chunked prefill that splits an image leaves the rows before
the split causal (the engine's default token budget keeps a 256-token image in one chunk).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.llm.engine.context import get_context
from vlchat.llm.engine.transfer import tensor_to_device
from vlchat.llm.layers.attention import Attention
from vlchat.llm.weights import WeightRule
from vlchat.vision.encoders.clip import ClipVisionConfig, ClipVisionTower
from vlchat.vision.models.base import VisionLanguageModel
from vlchat.vision.models.llava import LLAVA_LAYOUT, LlavaForConditionalGeneration

GEMMA3_LAYOUT = [
    *LLAVA_LAYOUT,
    WeightRule(r"^vision_tower\.(vision_model\.)?post_layernorm\.", "vision_post_layernorm."),
]


@dataclass(slots=True)
class ImageRuns:
    """The image runs among this step's new tokens: (row_lo, row_hi, pos_lo, pos_hi, batch index)."""

    runs: list[tuple[int, int, int, int, int]] = field(default_factory=list)


class ImageRunAttention(nn.Module):
    """Wraps a decoder `Attention`: its output, with the rows of image runs recomputed bidirectionally."""

    def __init__(self, inner: Attention, runs: ImageRuns) -> None:
        super().__init__()
        self.inner = inner
        self.image_runs = runs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim] -> [tokens, heads, head_dim]
        out = self.inner(q, k, v)
        ctx = get_context()
        if not self.image_runs.runs or ctx is None or self.inner.kv_cache is None:
            return out
        k_cache, v_cache = self.inner.kv_cache
        block_size = k_cache.shape[1]
        group = self.inner.num_heads // self.inner.num_kv_heads
        window = self.inner.sliding_window
        for row_lo, row_hi, pos_lo, pos_hi, seq in self.image_runs.runs:
            blocks = ctx.block_tables[seq, : -(-pos_hi // block_size)].long()
            keys = k_cache[blocks].flatten(0, 1)[:pos_hi]  # [pos_hi, kv_heads, head_dim]
            values = v_cache[blocks].flatten(0, 1)[:pos_hi]
            q_pos = torch.arange(pos_lo, pos_hi, device=q.device)[:, None]
            k_pos = torch.arange(pos_hi, device=q.device)[None, :]
            visible = (k_pos <= q_pos) | (k_pos >= pos_lo)  # causal, or the same image
            if window:
                visible &= k_pos > q_pos - window
            attn = F.scaled_dot_product_attention(
                q[row_lo:row_hi].transpose(0, 1).float(),  # [heads, n, d]
                keys.transpose(0, 1).repeat_interleave(group, 0).float(),
                values.transpose(0, 1).repeat_interleave(group, 0).float(),
                attn_mask=visible,
                scale=self.inner.scale,
            )  # [heads, n, d]
            out[row_lo:row_hi] = attn.transpose(0, 1).to(out.dtype)
        return out


class Gemma3Projector(nn.Module):
    """Patch grid -> avg-pooled to tokens_per_side^2 -> (1 + w) RMSNorm -> x @ W (HF Gemma3MultiModalProjector)."""

    def __init__(self, vision_hidden: int, text_hidden: int, patches_per_side: int, tokens: int, eps: float) -> None:
        super().__init__()
        self.patches_per_side = patches_per_side
        self.kernel = patches_per_side // int(tokens**0.5)
        self.eps = eps
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision_hidden, text_hidden), requires_grad=False)
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.zeros(vision_hidden), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [images, patches, d] -> [images, tokens, text_hidden]
        n, _, d = x.shape
        grid = x.transpose(1, 2).reshape(n, d, self.patches_per_side, self.patches_per_side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)  # [n, tokens, d]
        h = pooled.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = (h * (1.0 + self.mm_soft_emb_norm.weight.float())).to(x.dtype)
        return torch.matmul(h, self.mm_input_projection_weight).type_as(x)


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        hf_config = copy.copy(hf_config)
        hf_config.text_config = copy.deepcopy(hf_config.text_config)
        hf_config.text_config.architectures = ["Gemma3ForCausalLM"]  # the text config names none
        super().__init__(hf_config, dtype)
        vision = hf_config.vision_config
        self.vision_tower = ClipVisionTower(ClipVisionConfig.from_hf(vision), [-1])
        self.vision_post_layernorm = nn.LayerNorm(vision.hidden_size, eps=vision.layer_norm_eps)
        self.multi_modal_projector = Gemma3Projector(
            vision.hidden_size, hf_config.text_config.hidden_size, vision.image_size // vision.patch_size,
            hf_config.mm_tokens_per_image, vision.layer_norm_eps,
        )  # fmt: skip
        self.image_runs = ImageRuns()
        for layer in self.language_model.model.layers:
            layer.self_attn.attn = ImageRunAttention(layer.self_attn.attn, self.image_runs)
        self.weight_mapping = self.build_weight_mapping(GEMMA3_LAYOUT, self.vision_tower.weight_rules())

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values: [images, C, H, W] -> [images, mm_tokens_per_image, text hidden]."""
        (feats,) = self.vision_tower(pixel_values)  # [images, patches, d]
        return self.multi_modal_projector(self.vision_post_layernorm(feats))

    def embed_multimodal(self, datas: list[dict]) -> list[torch.Tensor]:
        pixels = torch.cat([d["pixel_values"] for d in datas])
        pixels = tensor_to_device(pixels, self.vision_tower.embeddings.patch_embedding.weight.device)
        return list(self.run_vision(tuple(pixels.shape), self.image_features, pixels).unbind(0))

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        self.image_runs.runs = self._find_runs(input_ids, positions)
        try:
            return self.language_model(input_ids, positions, inputs_embeds)
        finally:
            self.image_runs.runs = []

    def _find_runs(self, input_ids: torch.Tensor, positions: torch.Tensor) -> list[tuple[int, int, int, int, int]]:
        ctx = get_context()
        if ctx is None or not ctx.is_prefill:
            return []
        is_image = input_ids == self.image_token_id  # [tokens]
        if not bool(is_image.any()):  # one host sync per prefill step
            return []
        flags, pos, cu = is_image.tolist(), positions.tolist(), ctx.cu_seqlens_q.tolist()
        runs = []
        for seq in range(len(cu) - 1):
            row = cu[seq]
            while row < cu[seq + 1]:
                if not flags[row]:
                    row += 1
                    continue
                end = row
                while end < cu[seq + 1] and flags[end] and pos[end] == pos[row] + (end - row):
                    end += 1
                runs.append((row, end, pos[row], pos[end - 1] + 1, seq))
                row = end
        return runs

    split_images = classmethod(LlavaForConditionalGeneration.split_images.__func__)

    @classmethod
    def placeholder_id(cls, processor) -> int:
        # the processor's `image_token_id` is <start_of_image>; the placeholders are <image_soft_token>
        tokenizer = processor.tokenizer
        return tokenizer.convert_tokens_to_ids(tokenizer.image_token)
