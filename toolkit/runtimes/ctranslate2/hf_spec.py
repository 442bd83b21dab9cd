"""An imported Marian, M2M100/NLLB, mBART or T5 as a CTranslate2 model, built with CTranslate2's spec API the way its
own Transformers converter builds these (BartLoader, MarianMTLoader, M2M100Loader, MBartLoader, T5Loader), from the
weights of tk's fp32 graphs (spec.graph_weights), so the conversion and the graphs compute the same function.

Where tk parts from CTranslate2's converter, it is to stay exact to `generate`:
  - the vocabulary is the model's token ids written as strings (tk tokenizes, as for tk's own Transformer), every id
    kept: CTranslate2's converter drops Marian's <pad>, which renormalises every step's probabilities without it;
  - the decoder starts from the embedding of decoder_start_token_id, as transformers does (CTranslate2's
    start_from_zero_embedding assumes that row is zero);
  - the tokens generate forbids (bad_words_ids: Marian's <pad>) are forbidden per call (engine: suppress_sequences),
    not removed from the model, so teacher-forced scores stay transformers' own;
  - layer norms use torch's epsilon (1e-5), not CTranslate2's default;
  - an mBART-cc25 starts its decoder with the target language's code, as generate is told to (CTranslate2's converter
    leaves the start to the caller): the conversion stores the directory's target, and the engine refuses another.
Imports numpy and (lazily) ctranslate2; never torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.core import architectures
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest


@dataclass(frozen=True)
class Layout:
    """What differs between the BART-family imports CTranslate2 runs."""

    pre_norm: bool  # M2M100/NLLB and mBART: pre-LN with a final layer norm per stack; Marian: post-LN
    position_offset: int  # rows of the position table before position 0 (M2M100's padding offset, mBART's learned 2)
    layernorm_embedding: bool = False  # mBART: a layer norm over the embeddings and positions, before the layers


def layout(m: Manifest) -> dict | None:
    """The CTranslate2 layout the model's architecture entry declares (a Layout's fields, or relative_bias for a
    T5-like one); None: not an import this module converts."""
    arch = architectures.ARCHITECTURES.get(m.model)
    return arch.ctranslate2 if arch is not None else None

# transformers' activation names as CTranslate2's (its converter's _SUPPORTED_ACTIVATIONS, the ones these models use).
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_python": "GELU", "gelu_new": "GELUTanh", "gelu_fast": "GELUTanh",
                "gelu_pytorch_tanh": "GELUTanh", "swish": "SWISH", "silu": "SWISH"}


def _t5_activation(cfg: dict) -> tuple[str | None, bool]:
    """(transformers' activation name, gated) of a T5 feed-forward, as T5Config derives them from feed_forward_proj."""
    proj = str(cfg.get("feed_forward_proj", "relu"))
    gated = proj.startswith("gated-")
    act = proj.split("-")[-1]
    return ("gelu_new" if gated and act == "gelu" else act), gated


def conversion_problem(m: Manifest) -> str | None:
    """Why an import of a supported architecture still cannot be converted, or None."""
    activation = _t5_activation(m.config)[0] if layout(m).get("relative_bias") else m.config.get("activation_function")
    if activation not in _ACTIVATIONS:
        return (f"{m.directory}'s activation {activation!r} has no CTranslate2 counterpart tk maps; "
                "use --runtime onnxruntime (the default)")
    return None


def _tokens(spec, m: Manifest) -> None:
    """The converted config's special tokens: the model's own ids, written as strings (tk tokenizes), the decoder
    started as generate starts it (an mBART-cc25's: the directory's target language)."""
    rules = m.rules()
    spec.config.unk_token = str(m.special_tokens.get("unk", rules.end) if m.special_tokens else rules.end)
    spec.config.bos_token, spec.config.eos_token = str(rules.start), str(rules.end)
    spec.config.decoder_start_token = str(rules.start)


def _first(w: dict[str, np.ndarray], *names: str) -> np.ndarray:
    """The first of the names the graphs hold: a tied weight is stored once, under the name the exporter met first."""
    for name in names:
        if name in w:
            return w[name]
    raise UsageError(f"the graphs hold none of {', '.join(names)}; re-export the model directory")


def _bias(w: dict[str, np.ndarray], name: str, size: int) -> np.ndarray:
    """A bias, or zeros where the exporter folded away a bias of zeros (the graphs compute without it)."""
    return w[name] if name in w else np.zeros(size, dtype=np.float32)


def _linear(spec, w: dict[str, np.ndarray], scopes: list[str]) -> None:
    """One CTranslate2 linear of one or more transformers linears stacked on the output axis (fused Q/K/V)."""
    weights = [w[f"{s}.weight"] for s in scopes]
    spec.weight = np.ascontiguousarray(np.concatenate(weights), dtype=np.float32)
    spec.bias = np.ascontiguousarray(np.concatenate([_bias(w, f"{s}.bias", x.shape[0]) for s, x in zip(scopes, weights)]),
                                     dtype=np.float32)


def _norm(spec, w: dict[str, np.ndarray], scope: str) -> None:
    spec.gamma = w[f"{scope}.weight"]
    spec.beta = _bias(w, f"{scope}.bias", w[f"{scope}.weight"].shape[0])


def _attention(spec, w: dict[str, np.ndarray], scope: str, self_attention: bool) -> None:
    q, k, v = (f"{scope}.{x}_proj" for x in "qkv")
    o = f"{scope}.out_proj"
    if self_attention:
        _linear(spec.linear[0], w, [q, k, v])
    else:
        _linear(spec.linear[0], w, [q])
        _linear(spec.linear[1], w, [k, v])
    _linear(spec.linear[-1], w, [o])


def _layers(stack_spec, w: dict[str, np.ndarray], stack: str, decoder: bool) -> None:
    for i, layer in enumerate(stack_spec.layer):
        p = f"model.{stack}.layers.{i}"
        _attention(layer.self_attention, w, f"{p}.self_attn", True)
        _norm(layer.self_attention.layer_norm, w, f"{p}.self_attn_layer_norm")
        if decoder:
            _attention(layer.attention, w, f"{p}.encoder_attn", False)
            _norm(layer.attention.layer_norm, w, f"{p}.encoder_attn_layer_norm")
        _linear(layer.ffn.linear_0, w, [f"{p}.fc1"])
        _linear(layer.ffn.linear_1, w, [f"{p}.fc2"])
        _norm(layer.ffn.layer_norm, w, f"{p}.final_layer_norm")


def _positions(w: dict[str, np.ndarray], stack: str, offset: int) -> np.ndarray:
    table = _first(w, f"model.{stack}.embed_positions.weight", f"model.{stack}.embed_positions.weights")
    return np.ascontiguousarray(table[offset:], dtype=np.float32)


def model_spec(m: Manifest, w: dict[str, np.ndarray] | None, specs):
    """A ctranslate2 TransformerSpec of the import's sizes, with the graphs' weights `w` (None: the config only)."""
    common_spec, ts = specs
    if problem := conversion_problem(m):
        raise UsageError(problem)
    if layout(m).get("relative_bias"):
        return _t5_spec(m, w, specs)
    cfg, layout_of = m.config, Layout(**layout(m))
    activation = getattr(common_spec.Activation, _ACTIVATIONS[cfg["activation_function"]])
    spec = ts.TransformerSpec.from_config((cfg["encoder_layers"], cfg["decoder_layers"]), cfg["encoder_attention_heads"],
                                          pre_norm=layout_of.pre_norm, activation=activation,
                                          layernorm_embedding=layout_of.layernorm_embedding)
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default, which transformers' BART family uses
    _tokens(spec, m)
    if w is None:
        return spec
    scale = math.sqrt(cfg["d_model"]) if cfg.get("scale_embedding") else 1.0
    head = _first(w, "lm_head.weight", "model.decoder.embed_tokens.weight", "model.shared.weight")
    for stack, stack_spec in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        stack_spec.scale_embeddings = scale
        stack_spec.position_encodings.encodings = _positions(w, stack, layout_of.position_offset)
        embeddings = stack_spec.embeddings[0] if isinstance(stack_spec.embeddings, list) else stack_spec.embeddings
        # Tied models store the embedding once, as the output projection's weight.
        embeddings.weight = _first(w, f"model.{stack}.embed_tokens.weight", "model.shared.weight", "lm_head.weight")
        if layout_of.layernorm_embedding:
            _norm(stack_spec.layernorm_embedding, w, f"model.{stack}.layernorm_embedding")
        if layout_of.pre_norm:
            _norm(stack_spec.layer_norm, w, f"model.{stack}.layer_norm")
        _layers(stack_spec, w, stack, stack == "decoder")
    spec.decoder.projection.weight = np.ascontiguousarray(head, dtype=np.float32)
    if "final_logits_bias" in w:
        spec.decoder.projection.bias = np.ascontiguousarray(w["final_logits_bias"].reshape(-1), dtype=np.float32)
    return spec


def _t5_spec(m: Manifest, w: dict[str, np.ndarray] | None, specs):
    """T5, T5 v1.1, Flan-T5 and mT5 as CTranslate2's T5Loader builds them: pre-LN with RMS norms (no mean, no bias),
    one relative position bias per stack (the first layer's, which every layer uses), queries unscaled, a gated
    feed-forward where the config says so, and the output scaled by d_model^-0.5 when the head is tied."""
    common_spec, ts = specs
    cfg = m.config
    name, gated = _t5_activation(cfg)
    spec = ts.TransformerSpec.from_config((cfg["encoder_layers"], cfg["decoder_layers"]), cfg["num_heads"], pre_norm=True,
                                          activation=getattr(common_spec.Activation, _ACTIVATIONS[name]), ffn_glu=gated,
                                          relative_attention_bias=True, rms_norm=True)
    spec.config.layer_norm_epsilon = float(cfg.get("layer_norm_epsilon", 1e-6))
    _tokens(spec, m)
    if w is None:
        return spec
    # The embedding is stored once, under the first name the exporter met (a tied one as the output layer's).
    tied = bool(cfg.get("tie_word_embeddings", True))
    names = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", *(("lm_head.weight",) if tied else ()))
    for stack, stack_spec in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        embeddings = stack_spec.embeddings[0] if isinstance(stack_spec.embeddings, list) else stack_spec.embeddings
        embeddings.weight = np.ascontiguousarray(_first(w, f"{stack}.embed_tokens.weight", *names), dtype=np.float32)
        stack_spec.scale_embeddings = False
        stack_spec.layer_norm.gamma = w[f"{stack}.final_layer_norm.weight"]
        for i, layer in enumerate(stack_spec.layer):
            p = f"{stack}.block.{i}.layer"
            _t5_attention(layer.self_attention, w, f"{p}.0.SelfAttention", True, f"{stack}.block.0.layer.0.SelfAttention",
                          cfg)
            layer.self_attention.layer_norm.gamma = w[f"{p}.0.layer_norm.weight"]
            if stack == "decoder":
                _t5_attention(layer.attention, w, f"{p}.1.EncDecAttention", False, None, cfg)
                layer.attention.layer_norm.gamma = w[f"{p}.1.layer_norm.weight"]
            ffn = f"{p}.{2 if stack == 'decoder' else 1}"
            if gated:
                _linear(layer.ffn.linear_0, w, [f"{ffn}.DenseReluDense.wi_0"])
                _linear(layer.ffn.linear_0_noact, w, [f"{ffn}.DenseReluDense.wi_1"])
            else:
                _linear(layer.ffn.linear_0, w, [f"{ffn}.DenseReluDense.wi"])
            _linear(layer.ffn.linear_1, w, [f"{ffn}.DenseReluDense.wo"])
            layer.ffn.layer_norm.gamma = w[f"{ffn}.layer_norm.weight"]
    head = _first(w, "lm_head.weight", *names)
    spec.decoder.projection.weight = np.ascontiguousarray(head, dtype=np.float32)
    if cfg.get("scale_decoder_outputs", tied):
        spec.decoder.scale_outputs = float(cfg["d_model"]) ** -0.5
    return spec


def _t5_attention(spec, w: dict[str, np.ndarray], scope: str, self_attention: bool, bias_scope: str | None,
                  cfg: dict) -> None:
    """One T5 attention: no biases, queries unscaled; a self-attention takes its stack's relative position bias."""
    spec.queries_scale = 1.0
    if self_attention:
        _linear(spec.linear[0], w, [f"{scope}.{x}" for x in "qkv"])
    else:
        _linear(spec.linear[0], w, [f"{scope}.q"])
        _linear(spec.linear[1], w, [f"{scope}.k", f"{scope}.v"])
    _linear(spec.linear[-1], w, [f"{scope}.o"])
    if bias_scope is not None:
        spec.relative_attention_bias = np.ascontiguousarray(w[f"{bias_scope}.relative_attention_bias.weight"], dtype=np.float32)
        spec.relative_attention_max_distance = np.dtype("int32").type(cfg["relative_attention_max_distance"])
