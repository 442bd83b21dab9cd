"""tk's standalone attention modules: one graph each, no decoding."""

from toolkit.core.architectures import GRAPH_PATHS, MODULE, Architecture, register

for _name in ("masked_softmax", "dot_attention", "additive_attention", "multihead_attention"):
    register(Architecture(_name, MODULE, builder="toolkit.pytorch.tk_modules", paths=GRAPH_PATHS,
                          sizes={"query_size": (1, 1024), "key_size": (1, 1024), "value_size": (1, 1024)}))
