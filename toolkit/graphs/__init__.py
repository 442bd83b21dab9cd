"""The ONNX graph tools that no runtime owns, and every runtime shares (core below, runtimes above):

- variants.py          the catalogue's variants (toolkit.core.variants) built from the fp32 graphs: fp16, optimized, int8
- optimize.py          ONNX Runtime's graph optimiser run offline (constant folding, fusions), and the optimisers left off
- attention_fusion.py  the CPU variants' rewrite: each attention core -> com.microsoft.MultiHeadAttention
- int8_tables.py       one int8 copy of a table both looked up and multiplied by
- zero_bias.py         all-zero biases dropped from the CPU variants
- graph_files.py       intermediate graph files, their weights beside them (past protobuf's 2 GB)
- helper_graphs.py     the graphs tk builds to run beside the exported ones (CUDA probe, TopK ranking, row selection)

Imports onnx and (for the variants) ONNX Runtime's offline tools, lazily; never a runtime of toolkit.runtimes, never
torch. Importers name the module that holds what they use.
"""
