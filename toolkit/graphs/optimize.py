"""ONNX Runtime's graph optimiser used offline, as a graph tool: a graph saved as its CPU provider would run it after
one optimisation level (the variants' constant folding and fusions). The sessions that run graphs are the runtime's
(toolkit.runtimes.onnxruntime.sessions), which take the same disabled optimisers."""

from __future__ import annotations

from pathlib import Path

# ONNX Runtime's CPU SkipLayerNormalization kernel is slower than the Add + LayerNormalization it
# replaces: measured on the shipped Transformer at batch 64, the encoder runs in 11.9 ms instead of
# 14.4 ms and a decoder step in 2.60 ms instead of 2.85 ms with this fusion off (onnxruntime 1.31).
# FuseFp16InitializerToFp32NodeTransformer (level "all", fp16 graphs on the CPU only) crashes the process while
# the session is made for the fp16 variant of a pre-LN Transformer on nn.MultiheadAttention (a segmentation fault,
# onnxruntime 1.31; the same transform family fails sessions in microsoft/onnxruntime#26717). It only folds fp16
# weights into float ones for a CPU without fp16 arithmetic, so fp32 and int8 graphs never meet it.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion", "FuseFp16InitializerToFp32NodeTransformer")
LEVELS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC", "disabled": "ORT_DISABLE_ALL"}


def options(level: str = "all"):
    """ONNX Runtime's session options at one optimisation level, silent."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    return so


def save_optimized(src: Path, dst: Path, level: str, weights_file: str | None = None) -> None:
    """Saves the graph as ONNX Runtime's CPU provider would run it after `level` optimisations; with `weights_file`,
    its weights go to that file beside `dst` (past protobuf's 2 GB)."""
    import onnxruntime as ort

    so = options(level)
    so.optimized_model_filepath = str(dst)
    if weights_file is not None:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", weights_file)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"], disabled_optimizers=list(CPU_DISABLED_OPTIMIZERS))
