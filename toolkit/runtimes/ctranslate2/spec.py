"""A tk Transformer's weights as a CTranslate2 model (`tk export DIR --ctranslate2`, and `tk bench`'s comparison rows).

Weights are read back from the exported fp32 graphs (ONNX initializers, as verify reads
them), so the CTranslate2 model and tk's graphs compute the same function; the spec is
built with CTranslate2's Python spec API the way its OpenNMT-py converter builds one.
Imports onnx, numpy and (lazily) ctranslate2; never torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.core.declaration import transformer_layers
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest
from toolkit.core.tokenizer import BOS, EOS, UNK


def graph_weights(m: Manifest) -> dict[str, np.ndarray]:
    """Every named weight of the encoder and decoder graphs (the tied embedding appears in both)."""
    import onnx
    from onnx import numpy_helper

    weights: dict[str, np.ndarray] = {}
    for name in ("encoder", "decoder"):
        graph = onnx.load(str(m.directory / m.graphs[name].file))
        for init in graph.graph.initializer:
            if init.name.startswith("model."):
                weights[init.name[len("model."):]] = numpy_helper.to_array(init)
    return weights


def _linear(spec, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
    spec.weight = np.ascontiguousarray(weight, dtype=np.float32)
    if bias is not None:
        spec.bias = np.ascontiguousarray(bias, dtype=np.float32)


def _norm(spec, w: dict[str, np.ndarray], scope: str) -> None:
    spec.gamma, spec.beta = w[f"{scope}.addnorm.ln.weight"], w[f"{scope}.addnorm.ln.bias"]


def _ffn(spec, w: dict[str, np.ndarray], scope: str) -> None:
    _linear(spec.linear_0, w[f"{scope}.ffn.dense1.weight"], w[f"{scope}.ffn.dense1.bias"])
    _linear(spec.linear_1, w[f"{scope}.ffn.dense2.weight"], w[f"{scope}.ffn.dense2.bias"])


def _self_attention(spec, w: dict[str, np.ndarray], scope: str, module: str) -> None:
    """Q, K and V as one fused projection (CTranslate2's layout), the output projection, and the sublayer's LayerNorm."""
    _linear(spec.linear[0], np.concatenate([w[f"{scope}.{module}.W_{x}.weight"] for x in "qkv"]))
    _linear(spec.linear[1], w[f"{scope}.{module}.W_o.weight"])
    _norm(spec.layer_norm, w, f"{scope}.sub1")


def _specs():
    """CTranslate2's spec modules, imported without torch: they import it when they can (for bfloat16 and
    torch tensors, neither used here), which would take seconds and break the deploy path's torch-free promise."""
    import sys

    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which the specs handle
    try:
        from ctranslate2.specs import common_spec
        from ctranslate2.specs import transformer_spec as ts
    finally:
        if blocked:
            del sys.modules["torch"]
    return common_spec, ts


def transformer_spec(m: Manifest):
    """A ctranslate2 TransformerSpec holding the directory's weights (post-LN Transformer only)."""
    common_spec, ts = _specs()

    cfg = m.config
    if m.model != "transformer":
        raise UsageError(f"CTranslate2 runs tk's Transformer; {m.directory} holds a '{m.model}' model, which tk does not convert: "
                         "use --runtime onnxruntime")
    if cfg.get("pre_ln"):
        raise UsageError(f"{m.directory} is a pre-LN Transformer; tk converts post-LN Transformers to CTranslate2 only: "
                         "use --runtime onnxruntime")
    w = graph_weights(m)
    layers, heads = transformer_layers(cfg), cfg["num_heads"]  # (encoder, decoder): the two may differ
    spec = ts.TransformerSpec.from_config(layers, heads, pre_norm=False, activation=common_spec.Activation.RELU)
    emb = w["embedding.weight"]
    for stack in (spec.encoder, spec.decoder):
        # The sinusoidal table is given as learned positions: tk interleaves sin/cos, CTranslate2's own table does not.
        stack.position_encodings.encodings = w["pos_encoding.P"]
    spec.encoder.embeddings[0].weight = emb
    spec.decoder.embeddings.weight = emb
    _linear(spec.decoder.projection, emb)  # tied output projection
    for i, layer in enumerate(spec.encoder.layer):
        p = f"encoder_blocks.{i}"
        _self_attention(layer.self_attention, w, p, "attention")
        _ffn(layer.ffn, w, p)
        _norm(layer.ffn.layer_norm, w, f"{p}.sub2")
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder_blocks.{i}"
        _self_attention(layer.self_attention, w, p, "self_attention")
        cross = layer.attention
        _linear(cross.linear[0], w[f"{p}.cross_attention.W_q.weight"])
        _linear(cross.linear[1], np.concatenate([w[f"{p}.cross_attention.W_{x}.weight"] for x in "kv"]))
        _linear(cross.linear[2], w[f"{p}.cross_attention.W_o.weight"])
        _norm(cross.layer_norm, w, f"{p}.sub2")
        _ffn(layer.ffn, w, p)
        _norm(layer.ffn.layer_norm, w, f"{p}.sub3")
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default
    # Token ids are the vocabulary: tk tokenizes, CTranslate2 sees ids written as strings.
    vocab = [str(i) for i in range(cfg["vocab_size"])]
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = str(UNK), str(BOS), str(EOS)
    spec.config.decoder_start_token = str(BOS)
    return spec


def convert(m: Manifest, out_dir: str | Path) -> Path:
    """Writes the CTranslate2 model (float32 weights; int8 is chosen at load) into out_dir."""
    out = Path(out_dir)
    spec = transformer_spec(m)
    out.mkdir(parents=True, exist_ok=True)
    spec.validate()
    spec.optimize(quantization=None)
    spec.save(str(out))
    return out
