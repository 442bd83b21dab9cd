"""tk's GRU encoder and Bahdanau-attention GRU decoder, trained by `tk train`; shipped as an example."""

from toolkit.core.architectures import GRAPH_PATHS, SEQ2SEQ, Architecture, register

ENTRY = register(Architecture(
    "seq2seq", SEQ2SEQ, lambda c: {"state"}, (), ("sentencepiece",), "start <bos>, end <eos>, GNMT length penalty",
    builder="toolkit.pytorch.tk_models", paths={**GRAPH_PATHS, "web": None}, figure="bahdanau", shipped="example"))
