"""summarize: long-document summaries from recurrent-state language models, on your own machine."""

__version__ = "0.1.0"
