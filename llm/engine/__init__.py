"""The serving engine: sequences, paged KV blocks, scheduler, model runner, step loop."""
