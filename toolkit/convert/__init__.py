"""Every writer of tk, one module each (to_hf, web, ctranslate2, variants, guarded_int8), run by the one converter
pipeline (toolkit.convert.pipeline: load, validate, write to a temporary directory, the writer's own check, move into
place, through toolkit.core.outputs); and the table of the writers `tk export DIR --NAME` offers
(toolkit.convert.registry)."""

from toolkit.convert.pipeline import IntoModelDirectory, NewDirectory, Writer, convert

__all__ = ["IntoModelDirectory", "NewDirectory", "Writer", "convert"]
