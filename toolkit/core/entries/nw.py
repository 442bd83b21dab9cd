"""Nadaraya-Watson kernel regression: one graph, trained by `tk train`; shipped as an example."""

from toolkit.core.architectures import GRAPH_PATHS, MODULE, Architecture, register

ENTRY = register(Architecture("nw", MODULE, builder="toolkit.pytorch.tk_modules", paths=GRAPH_PATHS, figure="kernel",
                              shipped="example"))
