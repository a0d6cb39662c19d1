"""Reading inputs: PDF, text and Markdown files and stdin to clean text, and words and sentences."""
