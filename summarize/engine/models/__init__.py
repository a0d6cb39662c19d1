"""The model families, one file each (with its GGUF mapping), and the registry that picks one."""
