"""`python -m summarize`: the same command as `summarize`."""

from summarize.cli import main

main()
