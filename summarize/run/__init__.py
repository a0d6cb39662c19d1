"""A run of many inputs on this machine: the plan, each input's outcome, and where summaries land."""
