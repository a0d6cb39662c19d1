"""The diagnostics file (JSON lines) and the heatmap plot drawn from it."""
