"""summarize: long-document summaries from recurrent-state language models, on your own machine."""

from summarize.api import Summarizer, summarize_file, summarize_text
from summarize.errors import SummarizeError
from summarize.records import Summary

__version__ = "0.1.0"
__all__ = ["SummarizeError", "Summarizer", "Summary", "__version__", "summarize_file", "summarize_text"]
