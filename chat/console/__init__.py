"""The terminal: rich rendering and a messenger that prints and redraws."""
