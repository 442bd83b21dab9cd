"""CTranslate2: a tk Transformer converted to CTranslate2 (spec), stored in its model directory (toolkit.convert's `tk
export DIR --ctranslate2`) and run as `--runtime ctranslate2` (engine). Torch-free; ctranslate2 is imported only when used.
"""

from toolkit.runtimes.ctranslate2.engine import (
    INSTALL_HINT,
    Ct2Backend,
    Ct2Translator,
    LoadedCt2,
    available,
    fastest,
    load,
    thread_candidates,
    version,
)
from toolkit.runtimes.ctranslate2.spec import convert, graph_weights, model_spec, vocabularies

__all__ = ["INSTALL_HINT", "Ct2Backend", "Ct2Translator", "LoadedCt2", "available", "convert", "fastest", "graph_weights",
           "load", "model_spec", "thread_candidates", "version", "vocabularies"]
