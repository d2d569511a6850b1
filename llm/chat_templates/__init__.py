"""Stock chat templates for checkpoints that carry none (GGUF files from llama.cpp)."""
