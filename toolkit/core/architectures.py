"""Every architecture tk exports, one torch-free module each in toolkit/core/entries/, found and registered at import.

An entry states what the rest of tk would otherwise branch on a model's name for: its graphs (kind), the decoder cache
it carries from step to step (from its config), the config fields its size rules need, its tokenizer (and the
tokenizer kinds only it uses), its decoding rules in words, where it comes from (tk's training, a Hugging Face
directory, your own code), the `model_type` of a Hugging Face config.json it imports, its CTranslate2 layout, which
paths support it (each path asks `entry.check(path)`), and the one module that builds it (toolkit/pytorch/ or
models/: its MODEL, the torch side's config class, build, graphs and attention). Adding an architecture is a new module
in toolkit/core/entries/ plus its builder module (docs/architecture.md has the recipe).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from toolkit.core.declaration import ADAPTER, HF, TK, TOKENIZERS, TokenizerKind, self_attention_cache  # noqa: F401
from toolkit.core.errors import UsageError

# The paths an architecture may support, as docs/models.md's table names them.
PATHS = ("export", "verify", "int8", "cuda", "openvino", "ctranslate2", "web")
# The graph layouts a manifest's "kind" names; the second coincides with one architecture's name (tk's GRU).
SEQ2SEQ, MODULE = "seq2seq", "module"
GRAPHS = {SEQ2SEQ: ("encoder", "decoder"), MODULE: ("model",)}
# Every graph path tk has runs the ONNX graphs of an encoder-decoder in tk's cache layout; CTranslate2 and the browser
# read their own formats, converted per architecture.
GRAPH_PATHS = dict.fromkeys(("export", "verify", "int8", "cuda", "openvino"))
# The largest model tk builds, trains and loads: the bounds of every size a config states, checked before anything is
# allocated, in a manifest as it is read (a max_len of 100000 crashed translate) and in every config the registry builds
# (`tk train --set`, a checkpoint's). Transformer-big (209M parameters at a 32k vocabulary) fits; a Transformer at every
# bound has 537M (9 GB to train with Adam). Fields several architectures share; an entry bounds its own (`sizes`).
SIZES = {
    # 4 special tokens and at least one piece; at most NLLB-200's 256,206 and mBART-50's 250,054, with room.
    "vocab_size": (5, 262144),
    "num_hiddens": (1, 1024),
    "embed_size": (1, 1024),
    "ffn_num_hiddens": (1, 4096),
    "num_heads": (1, 64),
    "num_layers": (1, 48),  # T5-xl and NLLB-3.3B have 24 per stack
    "max_len": (2, 1024),  # BOS and one token at least
    # The imports' (opus-mt-*-big: d_model 1024, ffn 4096, 16 heads, 6 layers).
    "d_model": (1, 1024),
    "encoder_layers": (1, 48),
    "decoder_layers": (1, 48),
    "encoder_attention_heads": (1, 64),
    "decoder_attention_heads": (1, 64),
    "encoder_ffn_dim": (1, 8192),
    "decoder_ffn_dim": (1, 8192),
    "max_position_embeddings": (2, 4096),
    "pad_token_id": (0, 262143),
    "eos_token_id": (0, 262143),
    "decoder_start_token_id": (0, 262143),
}


@dataclass(frozen=True)
class Architecture:
    """One architecture. `paths` maps each path it supports to None, and each it does not to the one line that
    refuses it (naming what does); a path left out is refused with a line built from the entries that support it."""

    name: str
    kind: str  # SEQ2SEQ: an encoder graph and a one-step decoder graph; MODULE: one standalone graph
    cache: Callable[[dict], set[str]] | None = None  # the decoder's carried state, from the manifest's config
    required: tuple[str, ...] = ()  # config fields the cache and the size rules cannot do without
    tokenizer: tuple[str, ...] = ()  # the TokenizerDeclaration kinds it ships with
    decoding: str = ""  # its decoding rules, in words (start token, forced first token, beam rule)
    origin: str = TK  # TK (trained by tk), HF (imported from a Hugging Face directory), ADAPTER (your code)
    hf_model_types: tuple[str, ...] = ()  # config.json model_type values `tk export hf:DIR` imports as this entry
    hf_class: str | None = None  # the transformers class its reference and `generate` are (origin HF)
    builder: str = ""  # the torch module that builds it (its MODEL, or MODELS by name), imported only by the torch side
    paths: dict[str, str | None] = field(default_factory=dict)
    # Variants (toolkit.core.variants) it must not run, each with the one line that refuses it; any other runs.
    refused_variants: dict[str, str] = field(default_factory=dict)
    # Tokenizer kinds no other architecture uses, declared here (toolkit.core.declaration.TokenizerKind).
    own_tokenizers: dict[str, TokenizerKind] = field(default_factory=dict)
    # How CTranslate2 lays it out (toolkit.runtimes.ctranslate2.hf_spec): an import's Layout fields, or
    # {"relative_bias": True} for a T5-like one; None: tk's own conversion (or none, per paths).
    ctranslate2: dict | None = None
    # The Hugging Face architecture `tk export DIR --to-hf` writes this one as (None: it writes none).
    writes_hf: Architecture | None = None
    # How `tk attention` draws it: "heads" (per-head self- and cross-attention), "bahdanau" (one cross-attention per
    # step), "kernel" (weights over training points); None: it draws nothing.
    figure: str | None = None
    # A model the repository ships in exported/<name>: "default" (what Translator() loads), "example", or None.
    shipped: str | None = None
    # The bounds (low, high) of its config's own size fields, beside the shared SIZES.
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)

    def supports(self, path: str) -> bool:
        return path in self.paths and self.paths[path] is None

    def refusal(self, path: str) -> str | None:
        """None where `path` supports this architecture, else one line saying so and naming what it supports."""
        if self.supports(path):
            return None
        if self.paths.get(path):
            return self.paths[path]
        others = [a.name for a in ARCHITECTURES.values() if a.supports(path)]
        return f"{path} does not support a '{self.name}' model; it supports {', '.join(others) or 'none yet'}"

    def check(self, path: str) -> None:
        problem = self.refusal(path)
        if problem:
            raise UsageError(problem)


ARCHITECTURES: dict[str, Architecture] = {}


def check_variant(model: str, variant: str) -> None:
    """Refuses, in the entry's own line, a variant the model's architecture must not run (T5 in float16), or a path
    (int8, cuda) it does not support; a model no entry declares is left to the manifest's own checks."""
    arch = ARCHITECTURES.get(model)
    if arch is None:
        return
    if variant in arch.refused_variants:
        raise UsageError(arch.refused_variants[variant])
    arch.check("int8" if "int8" in variant else "cuda" if "fp16" in variant else "export")


def register(arch: Architecture) -> Architecture:
    if arch.kind not in GRAPHS:
        raise UsageError(f"architecture {arch.name}: kind must be one of {', '.join(GRAPHS)}, got {arch.kind!r}")
    unknown = sorted(set(arch.paths) - set(PATHS))
    if unknown:
        raise UsageError(f"architecture {arch.name}: {unknown[0]!r} is not a path ({', '.join(PATHS)})")
    ARCHITECTURES[arch.name] = arch
    TOKENIZERS.update(arch.own_tokenizers)  # the kinds a declaration may name from now on
    SIZES.update(arch.sizes)
    return arch


def get(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise UsageError(f"unknown architecture '{name}'; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def imported(name: str) -> bool:
    """Whether a model of this name came from a Hugging Face directory (its reference is transformers')."""
    return name in ARCHITECTURES and ARCHITECTURES[name].origin == HF


def shipped(role: str) -> list[str]:
    """The architectures whose model the repository ships in exported/ in this role ("default", "example")."""
    return [a.name for a in ARCHITECTURES.values() if a.shipped == role]


def for_hf_model_type(model_type: object, where: str) -> Architecture:
    """The entry that imports a Hugging Face config.json of this model_type, or one line naming those tk imports."""
    for arch in ARCHITECTURES.values():
        if model_type in arch.hf_model_types:
            return arch
    known = ", ".join(f"{a.hf_class} (model_type {'/'.join(repr(t) for t in a.hf_model_types)})"
                      for a in ARCHITECTURES.values() if a.hf_model_types)
    raise UsageError(f"{where} has model_type {model_type!r}; tk imports {known} from Hugging Face")


def declared_state(graphs: object) -> set[str]:
    """The decoder cache an adapter's config declares (its graphs as JSON); empty when that is malformed."""
    try:
        specs = json.loads(graphs) if isinstance(graphs, str) else None
        decoder = next(g for g in specs if isinstance(g, dict) and g.get("name") == "decoder")
        return set(decoder.get("updates", {}).values())
    except (TypeError, ValueError, StopIteration, AttributeError, RecursionError):
        return set()


def hf_cache(config: dict) -> set[str]:
    """An imported encoder-decoder's decoder cache in tk's layout: a key and a value per decoder layer."""
    return self_attention_cache(config["decoder_layers"])


_ENTRIES = importlib.import_module("toolkit.core.entries")
for _module in sorted(m.name for m in pkgutil.iter_modules(_ENTRIES.__path__)):  # each module registers its entries
    importlib.import_module(f"{_ENTRIES.__name__}.{_module}")
