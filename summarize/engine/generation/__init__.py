"""Generation: plain and speculative decoding, and where drafts come from."""
