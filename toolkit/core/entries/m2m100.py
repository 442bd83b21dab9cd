"""Hugging Face M2M100ForConditionalGeneration (M2M-100, NLLB-200), imported with `tk export hf:DIR`
(toolkit.pytorch.hf_m2m100)."""

from toolkit.core.architectures import GRAPH_PATHS, HF, SEQ2SEQ, Architecture, hf_cache, register
from toolkit.core.declaration import TokenizerKind

ENTRY = register(Architecture(
    "m2m100", SEQ2SEQ, hf_cache, ("decoder_layers",), ("m2m100", "tokenizer.json"),
    "source [lang] text </s>; start </s> (decoder_start_token_id), the target language's token forced first, "
    "end </s> forced at the limit, generate's beam rule (M2M100 and NLLB-200)",
    origin=HF, hf_model_types=("m2m_100",), hf_class="M2M100ForConditionalGeneration",
    builder="toolkit.pytorch.hf_m2m100", paths={**GRAPH_PATHS, "ctranslate2": None, "web": None},
    own_tokenizers={"m2m100": TokenizerKind("toolkit.core.tokenizers:SpmVocabTokenizer.load", needs_vocab=True)},
    ctranslate2={"pre_norm": True, "position_offset": 2}))
