"""Vision-language models: image encoders and projectors on our kernels, and the glue to the engine.

`vision.encoders` (CLIP/SigLIP, Qwen2-VL/2.5-VL ViT, InternViT), `vision.projectors`,
`vision.models` (the VLM classes the engine's registry names by string), `vision.processing`
(messages -> HF processor -> MultiModalPrompt) and `vision.mrope` (Qwen's M-RoPE).
"""
