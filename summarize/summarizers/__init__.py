"""Ways of summarizing a text: with a model (chunked, cached, batched) or extractively, and the factory that picks one."""
