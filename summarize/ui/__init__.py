"""What the user sees on stderr: the terminal UI, the live view of the state, a library call's notes."""
