"""Hugging Face T5ForConditionalGeneration (T5, T5 v1.1, Flan-T5) and MT5ForConditionalGeneration (mT5), imported
with `tk export hf:DIR` (toolkit.pytorch.hf_t5)."""

from toolkit.core.architectures import GRAPH_PATHS, HF, SEQ2SEQ, Architecture, hf_cache, register
from toolkit.core.declaration import TokenizerKind

ENTRY = register(Architecture(
    "t5", SEQ2SEQ, hf_cache, ("decoder_layers",), ("t5",),
    "source [task prefix of the chosen pair] text </s>; start <pad> (decoder_start_token_id 0), end </s>, no forced first "
    "token, generate's beam rule and length penalty (T5, T5 v1.1, Flan-T5, mT5)",
    origin=HF, hf_model_types=("t5", "mt5"), hf_class="T5ForConditionalGeneration", builder="toolkit.pytorch.hf_t5",
    paths={**GRAPH_PATHS, "ctranslate2": None, "web": None},
    # transformers clamps T5's hidden states when it runs in float16 because its feed-forward outputs pass float16's
    # 65,504 (T5 v1.1, Flan-T5 and mT5 were trained in bfloat16; CTranslate2 #1074 reports the garbage): a plain
    # float16 graph has no such clamp, so tk does not make one.
    refused_variants={"fp16": "a T5 model's activations overflow float16 (its feed-forward outputs pass 65,504; "
                              "transformers clamps them, an fp16 graph cannot): use the fp32 graphs, or --quantize "
                              "int8 on CPU"},
    # A task prefix per pair instead of language codes (toolkit.core.tokenizers.t5_pair).
    own_tokenizers={"t5": TokenizerKind("toolkit.core.tokenizers:T5SourceTokenizer.load", task_prefixes=True)},
    ctranslate2={"relative_bias": True},
    # per-head key size, feed-forward width, relative-position buckets
    sizes={"d_kv": (1, 1024), "d_ff": (1, 16384), "relative_attention_num_buckets": (2, 1024),
           "relative_attention_max_distance": (2, 65536)}))
