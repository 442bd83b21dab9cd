"""Hugging Face MBartForConditionalGeneration (mBART-cc25, mBART-50), imported with `tk export hf:DIR`
(toolkit.pytorch.hf_mbart)."""

from toolkit.core.architectures import GRAPH_PATHS, HF, SEQ2SEQ, Architecture, hf_cache, register
from toolkit.core.declaration import TokenizerKind

ENTRY = register(Architecture(
    "mbart", SEQ2SEQ, hf_cache, ("decoder_layers",), ("mbart", "tokenizer.json"),
    "mBART-50: source [lang] text </s>, start </s>, the target language's token forced first; mBART-cc25: source "
    "text </s> [lang], the decoder started with the target language's token; end </s> forced at the limit, generate's "
    "beam rule", origin=HF, hf_model_types=("mbart",), hf_class="MBartForConditionalGeneration",
    builder="toolkit.pytorch.hf_mbart",
    paths={**GRAPH_PATHS, "ctranslate2": None, "web": None},
    own_tokenizers={"mbart": TokenizerKind("toolkit.core.tokenizers:FairseqSpmTokenizer.load")},
    ctranslate2={"pre_norm": True, "position_offset": 2, "layernorm_embedding": True}))
