"""Writing converted outputs, one pipeline for every writer of tk (toolkit.convert.pipeline: load, validate, write to a
temporary directory, verify, move into place); the output-directory step they all take (toolkit.convert.output); and
the table of the writers `tk export DIR --NAME` offers (toolkit.convert.registry)."""

from toolkit.convert.pipeline import IntoModelDirectory, NewDirectory, Writer, convert

__all__ = ["IntoModelDirectory", "NewDirectory", "Writer", "convert"]
