"""Weight files: safetensors, GGUF (container, quants, sources, checkpoints)."""
