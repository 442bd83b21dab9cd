"""Your own encoder-decoder, exported with `tk export MODULE:FUNCTION` (toolkit.pytorch.adapter): its graphs as your
function declared them, decoded by tk's rules."""

from toolkit.core.architectures import ADAPTER, GRAPH_PATHS, SEQ2SEQ, Architecture, declared_state, register

ENTRY = register(Architecture(
    "adapter", SEQ2SEQ, lambda c: declared_state(c.get("graphs")), (), ("sentencepiece",),
    "tk's rules over the graphs your function declared", origin=ADAPTER, builder="toolkit.pytorch.adapter",
    paths=GRAPH_PATHS))
