"""Tokenizers: tokenizer.json (Qwen3.5), the RWKV world vocabulary, and those inside GGUF files."""
