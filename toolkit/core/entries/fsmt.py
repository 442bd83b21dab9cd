"""Hugging Face FSMTForConditionalGeneration (fairseq's WMT19 models), imported with `tk export hf:DIR`
(toolkit.pytorch.hf_fsmt); its tokenizer, Moses and BPE over two vocabularies, is toolkit.core.fsmt_tokenizer's."""

from toolkit.core.architectures import GRAPH_PATHS, HF, SEQ2SEQ, Architecture, hf_cache, register
from toolkit.core.declaration import TokenizerKind

ENTRY = register(Architecture(
    "fsmt", SEQ2SEQ, hf_cache, ("decoder_layers",), ("fsmt",),
    "source Moses + BPE text </s>; start </s> (decoder_start_token_id), end </s> forced at the limit, generate's beam "
    "rule; each step's position as the installed transformers line's generate gives it",
    origin=HF, hf_model_types=("fsmt",), hf_class="FSMTForConditionalGeneration", builder="toolkit.pytorch.hf_fsmt",
    paths={**GRAPH_PATHS,
           "ctranslate2": "CTranslate2 has no FSMT layout in tk (time-major layers, two vocabularies); translate an "
                          "imported FSMT with ONNX Runtime or OpenVINO",
           "web": "the browser site has no port of FSMT's Moses and BPE tokenizer; translate an imported FSMT with tk translate "
                  "or tk serve"},
    own_tokenizers={"fsmt": TokenizerKind("toolkit.core.fsmt_tokenizer:FsmtTokenizer.load", needs_vocab=True)},
    sizes={"decoder_vocab_size": (5, 262144)}))
