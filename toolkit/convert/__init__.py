"""Every writer of tk, one module each (to_hf, web, ctranslate2, variants, guarded_int8), run by the one converter
pipeline (toolkit.convert.pipeline); the writers `tk export DIR --NAME` offers are toolkit.convert.registry's table."""

from toolkit.convert.pipeline import IntoModelDirectory, NewDirectory, Writer, convert

__all__ = ["IntoModelDirectory", "NewDirectory", "Writer", "convert"]
