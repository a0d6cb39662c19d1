"""A run on a Ray cluster: its address, the worker pool, one worker, and the progress line."""
