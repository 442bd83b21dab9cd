"""tk's encoder-decoder Transformer (post-LN; pre-LN with --pre-ln), trained by `tk train`; the shipped model."""

from toolkit.core.architectures import GRAPH_PATHS, SEQ2SEQ, Architecture, register
from toolkit.core.declaration import self_attention_cache, transformer_layers

ENTRY = register(Architecture(
    "transformer", SEQ2SEQ, lambda c: self_attention_cache(transformer_layers(c)[1]), ("num_layers",), ("sentencepiece",),
    "start <bos>, end <eos>, GNMT length penalty (alpha 0.6)", builder="toolkit.pytorch.tk_models",
    paths={**GRAPH_PATHS, "web": None, "ctranslate2": None}, writes_hf="MarianMTModel", figure="heads", shipped="default"))
