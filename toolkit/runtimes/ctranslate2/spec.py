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
from toolkit.core.errors import UsageError, first_line
from toolkit.core.manifest import Manifest
from toolkit.core.node_map import node_origins
from toolkit.core.tokenizer import BOS, EOS, UNK


def external_data_problem(graph, m: Manifest, file: str) -> str | None:
    """Why a graph's external data may not be read, or None: every externally stored tensor must point into the
    weights file the manifest records for the model directory (a graph is a file from outside: a location such as
    ../../etc/passwd or an absolute path is never followed)."""
    recorded = {g.weights.file for g in m.graphs.values() if g.weights is not None}
    for init in graph.graph.initializer:
        if init.data_location != init.EXTERNAL:
            continue
        location = next((e.value for e in init.external_data if e.key == "location"), "")
        if location not in recorded:
            return (f"{m.directory / file}: tensor {init.name!r} points to external data {location!r}, not the model "
                    f"directory's weights file ({', '.join(sorted(recorded)) or 'none recorded'}); re-export the model directory")
    return None


def graph_weights(m: Manifest) -> dict[str, np.ndarray]:
    """Every named weight of the encoder and decoder graphs (the tied embedding appears in both). External data is read
    only from the weights file the manifest records (external_data_problem)."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_model

    weights: dict[str, np.ndarray] = {}
    for name in ("encoder", "decoder"):
        file = m.graphs[name].file
        try:
            graph = onnx.load(str(m.directory / file), load_external_data=False)
            problem = external_data_problem(graph, m, file)
            if problem:
                raise UsageError(problem)
            load_external_data_for_model(graph, str(m.directory))
            arrays = {init.name: numpy_helper.to_array(init) for init in graph.graph.initializer}
            for init_name, array in arrays.items():
                if init_name.startswith("model."):
                    weights[init_name[len("model."):]] = array
            _layer_norms_by_module(graph, node_origins(m, name), arrays, weights)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt graph or weights file (digests rewritten), in one line
            raise UsageError(f"cannot read the weights of {m.directory / file} ({first_line(e, 120)}); re-export the model directory") from None
    return weights


def _layer_norms_by_module(graph, origins: dict[str, list[str]], arrays: dict[str, np.ndarray],
                           weights: dict[str, np.ndarray]) -> None:
    """Each layer norm's scale and bias under its own module's name, where the graph holds it under another: the
    exporter stores identical tensors once (the unit scales and zero biases of an untrained model become one
    initializer named after the first of them), and the node map says which module each LayerNormalization is."""
    for node in graph.graph.node:
        module = origins.get(node.name, [None])[0]
        if node.op_type != "LayerNormalization" or not module:
            continue
        for slot, field in ((1, "weight"), (2, "bias")):
            if len(node.input) > slot and node.input[slot] in arrays:
                weights.setdefault(f"{module}.{field}", arrays[node.input[slot]])


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


def conversion_problem(m: Manifest) -> str | None:
    """Why tk cannot convert the directory's model to CTranslate2 (and what to run instead), or None. Said by
    `tk export DIR --ctranslate2` and by `--runtime ctranslate2` on a directory without a conversion, so that the one
    never advises the other where it would refuse."""
    from toolkit.core import architectures  # the entry says which architectures CTranslate2 runs
    from toolkit.runtimes.ctranslate2 import hf_spec

    arch = architectures.ARCHITECTURES.get(m.model)
    refusal = arch.refusal("ctranslate2") if arch else f"CTranslate2 does not run a '{m.model}' model"
    if refusal:
        return f"{m.directory}: {refusal}" + ("" if "--runtime onnxruntime" in refusal else "; use --runtime onnxruntime (the default)")
    if hf_spec.layout(m) is not None:
        return hf_spec.conversion_problem(m)
    if m.config.get("pre_ln"):
        return (f"{m.directory} is a pre-LN Transformer; tk converts post-LN Transformers to CTranslate2 only: "
                "use --runtime onnxruntime (the default)")
    return None


def _empty_spec(m: Manifest):
    """A ctranslate2 TransformerSpec of the directory's sizes, configured as tk converts it, without weights."""
    if problem := conversion_problem(m):
        raise UsageError(problem)
    return _spec(m, None)


def _spec(m: Manifest, w: dict[str, np.ndarray] | None):
    """The directory's spec with the weights `w` (None: its config only), built by the model's own converter."""
    from toolkit.runtimes.ctranslate2 import hf_spec

    if hf_spec.layout(m) is not None:
        return hf_spec.model_spec(m, w, _specs())
    spec = _tk_transformer(m)
    return spec if w is None else _tk_transformer_weights(spec, w)


def _tk_transformer(m: Manifest):
    """tk's own post-LN Transformer, configured as tk converts it, without weights."""
    common_spec, ts = _specs()
    cfg = m.config
    layers, heads = transformer_layers(cfg), cfg["num_heads"]  # (encoder, decoder): the two may differ
    spec = ts.TransformerSpec.from_config(layers, heads, pre_norm=False, activation=common_spec.Activation.RELU)
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default
    # Token ids are the vocabulary: tk tokenizes, CTranslate2 sees ids written as strings.
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = str(UNK), str(BOS), str(EOS)
    spec.config.decoder_start_token = str(BOS)
    return spec


# The config keys tk sets itself: a converted config.json must hold each (the others are CTranslate2's defaults, which
# a conversion by an older CTranslate2 may lack).
TK_CONFIG_KEYS = ("layer_norm_epsilon", "unk_token", "bos_token", "eos_token", "decoder_start_token")


def vocabularies(m: Manifest) -> tuple[list[str], list[str]]:
    """The converted (source, target) vocabularies: every token id of the model, written as a string (an
    opus-mt-tc-big-shaped Marian's decoder has a vocabulary of its own size)."""
    source = m.config["vocab_size"]
    target = m.config.get("decoder_vocab_size") or source
    return [str(i) for i in range(source)], [str(i) for i in range(target)]


def model_spec(m: Manifest):
    """A ctranslate2 TransformerSpec holding the directory's weights (tk's post-LN Transformer, an imported Marian or
    M2M100/NLLB)."""
    if problem := conversion_problem(m):
        raise UsageError(problem)
    spec = _spec(m, graph_weights(m))
    source, target = vocabularies(m)
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    return spec


def _tk_transformer_weights(spec, w: dict[str, np.ndarray]):
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
    return spec


def convert(m: Manifest, out_dir: str | Path) -> Path:
    """Writes the CTranslate2 model (float32 weights; int8 is chosen at load) into out_dir."""
    out = Path(out_dir)
    spec = model_spec(m)
    out.mkdir(parents=True, exist_ok=True)
    spec.validate()
    spec.optimize(quantization=None)
    spec.save(str(out))
    return out


# ---- a stored conversion, checked at load ----------------------------------------------------------------------------
# Its digests prove only that the files are the ones the manifest lists; whoever edited the files may have rewritten
# them. So each is also held to what tk writes: CTranslate2 would otherwise load a vocabulary of the wrong size or with
# other entries (and fail on the first token it cannot map back), or decode with a rule tk's loop does not have.

VOCABULARY_FILES = ("shared_vocabulary.json", "shared_vocabulary.txt", "source_vocabulary.json", "source_vocabulary.txt",
                    "target_vocabulary.json", "target_vocabulary.txt")


def _expected_vocabulary(m: Manifest, name: str) -> list[str]:
    """The entries tk writes to a vocabulary file: the target's for target_vocabulary, else the source's (CTranslate2
    writes one shared file when the two are equal)."""
    source, target = vocabularies(m)
    return target if name.startswith("target_") else source


def _missing_vocabulary(m: Manifest, names: list[str]) -> str | None:
    """The vocabulary file a conversion lacks, or None: one shared file when source and target are equal, else both."""
    source, target = vocabularies(m)
    stems = {n.rsplit(".", 1)[0] for n in names}
    if source == target:
        return None if stems == {"shared_vocabulary"} else "shared_vocabulary.json"
    return next((f"{s}.json" for s in ("source_vocabulary", "target_vocabulary") if s not in stems), None)


def _vocabulary_problem(m: Manifest, name: str, data: bytes) -> str | None:
    import json

    try:
        text = data.decode("utf-8")
        entries = json.loads(text) if name.endswith(".json") else text.splitlines()
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return f"is not a readable vocabulary ({first_line(e, 80)})"
    want = _expected_vocabulary(m, name)
    if not isinstance(entries, list) or len(entries) != len(want):
        size = len(entries) if isinstance(entries, list) else "no list of"
        return f"holds {size} entries, but the model's vocabulary has {len(want)}"
    wrong = next((i for i, (got, w) in enumerate(zip(entries, want)) if got != w), None)
    if wrong is not None:
        return f"entry {wrong} is {str(entries[wrong])[:40]!r}, not the token id {want[wrong]!r} tk writes there"
    return None


def _config_problem(m: Manifest, data: bytes) -> str | None:
    import json

    try:
        got = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return f"is not readable JSON ({first_line(e, 80)})"
    if not isinstance(got, dict):
        return "must hold a JSON object"
    want = json.loads(json.dumps(_empty_spec(m).config.to_dict()))
    for key, value in got.items():
        if key not in want:
            return f"has key {key!r}, which tk does not write"
        if value != want[key]:
            return f"has {key} {json.dumps(value)[:40]}, where tk writes {json.dumps(want[key])}"
    missing = next((k for k in TK_CONFIG_KEYS if k not in got), None)
    return f"lacks {missing}, which tk writes" if missing else None


def check_converted(m: Manifest, files: dict[str, bytes], paths: dict[str, Path]) -> None:
    """A one-line usage error unless the stored conversion's files (by CTranslate2's names, as `paths` name them in
    the directory) hold what tk writes: its model.bin, config.json (tk's values, no other keys) and the vocabularies
    of the model's token ids (one shared, or source and target; each its size the model's, each entry the id tk
    wrote)."""
    vocabularies = [name for name in files if name in VOCABULARY_FILES]
    for name in files:
        if name not in ("model.bin", "config.json", *VOCABULARY_FILES):
            raise UsageError(f"{paths[name]}: {name} is not a file tk's CTranslate2 conversion holds; "
                             f"convert it again with tk export {m.directory} --ctranslate2 --force")
    absent = next((name for name in ("model.bin", "config.json") if name not in files), None) or _missing_vocabulary(m, vocabularies)
    if absent is not None:
        raise UsageError(f"{m.directory}'s CTranslate2 conversion has no {absent}; convert it again with "
                         f"tk export {m.directory} --ctranslate2 --force")
    for name in [*vocabularies, "config.json"]:
        problem = _vocabulary_problem(m, name, files[name]) if name in vocabularies else _config_problem(m, files[name])
        if problem:
            raise UsageError(f"{paths[name]} {problem}: not the conversion tk wrote; convert it again with "
                             f"tk export {m.directory} --ctranslate2 --force")
