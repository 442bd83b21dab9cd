"""Text in, text out with the exported graphs alone (never torch): loading a model directory, translating
lines, the Python API, scoring, robustness sets and attention pictures."""
