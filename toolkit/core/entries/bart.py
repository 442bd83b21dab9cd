"""Hugging Face BartForConditionalGeneration (BART and its fine-tunes), imported with `tk export hf:DIR`
(toolkit.pytorch.hf_bart)."""

from toolkit.core.architectures import GRAPH_PATHS, HF, SEQ2SEQ, Architecture, hf_cache, register

ENTRY = register(Architecture(
    "bart", SEQ2SEQ, hf_cache, ("decoder_layers",), ("tokenizer.json",),
    "source <s> text </s>; start </s> (decoder_start_token_id), <s> forced first where the configs force it "
    "(bart-large's forced_bos_token_id), end </s> forced at the limit, generate's beam rule",
    origin=HF, hf_model_types=("bart",), hf_class="BartForConditionalGeneration", builder="toolkit.pytorch.hf_bart",
    paths={**GRAPH_PATHS, "ctranslate2": None, "web": None},
    ctranslate2={"pre_norm": False, "position_offset": 2, "layernorm_embedding": True}))
