"""Writing converted outputs: the one step every directory writer of tk takes (toolkit.convert.output)."""
