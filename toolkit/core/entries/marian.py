"""Hugging Face MarianMTModel (the OPUS-MT family), imported with `tk export hf:DIR` (toolkit.pytorch.hf_marian)."""

from toolkit.core.architectures import GRAPH_PATHS, HF, SEQ2SEQ, Architecture, hf_cache, register
from toolkit.core.declaration import TokenizerKind

ENTRY = register(Architecture(
    "marian", SEQ2SEQ, hf_cache, ("decoder_layers",), ("marian",),
    "start decoder_start_token_id (pad), end </s> forced at the limit, generate's beam rule and length penalty",
    origin=HF, hf_model_types=("marian",), hf_class="MarianMTModel", builder="toolkit.pytorch.hf_marian",
    paths={**GRAPH_PATHS, "ctranslate2": None, "web": None},
    own_tokenizers={"marian": TokenizerKind("toolkit.core.tokenizers:MarianTokenizer.load", needs_vocab=True)},
    ctranslate2={"pre_norm": False, "position_offset": 0}, sizes={"decoder_vocab_size": (5, 262144)}))
