"""Every architecture tk exports, declared once and registered by name (torch-free: the manifest checks, translate and
verify read it; toolkit/pytorch/ holds only the builders it names).

An entry states what the rest of tk would otherwise branch on a model's name for: its graphs (kind), the decoder cache
it carries from step to step (the layout, from its config), the config fields its size rules need, its tokenizer,
its decoding rules in words, where it comes from (tk's training, a Hugging Face directory, your own code), the
`model_type` of a Hugging Face config.json it imports, the module that builds it, and which paths support it. Adding
an architecture is one `register(Architecture(...))` here plus its builder module (tests/test_architecture.py shows it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from toolkit.core.declaration import self_attention_cache, transformer_layers
from toolkit.core.errors import UsageError

# The paths an architecture may support, as docs/models.md's table names them.
PATHS = ("export", "verify", "int8", "cuda", "openvino", "ctranslate2", "web")
SEQ2SEQ, MODULE = "seq2seq", "module"
GRAPHS = {SEQ2SEQ: ("encoder", "decoder"), MODULE: ("model",)}


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
    origin: str = "tk"  # "tk" (trained by tk), "hf" (imported from a Hugging Face directory), "adapter" (your code)
    hf_model_types: tuple[str, ...] = ()  # config.json model_type values `tk export hf:DIR` imports as this entry
    hf_class: str | None = None  # the transformers class its reference and `generate` are (origin "hf")
    builder: str = ""  # the torch module that builds it (toolkit/pytorch/), imported only by the torch side
    paths: dict[str, str | None] = field(default_factory=dict)
    # Variants (toolkit.core.variants) it must not run, each with the one line that refuses it; any other runs.
    refused_variants: dict[str, str] = field(default_factory=dict)

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
    """Refuses, in the entry's own line, a variant the model's architecture must not run (T5 in float16); a model no
    entry declares is left to the manifest's own checks."""
    arch = ARCHITECTURES.get(model)
    if arch is not None and variant in arch.refused_variants:
        raise UsageError(arch.refused_variants[variant])


def register(arch: Architecture) -> Architecture:
    if arch.kind not in GRAPHS:
        raise UsageError(f"architecture {arch.name}: kind must be one of {', '.join(GRAPHS)}, got {arch.kind!r}")
    unknown = sorted(set(arch.paths) - set(PATHS))
    if unknown:
        raise UsageError(f"architecture {arch.name}: {unknown[0]!r} is not a path ({', '.join(PATHS)})")
    ARCHITECTURES[arch.name] = arch
    return arch


def get(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise UsageError(f"unknown architecture '{name}'; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def imported(name: str) -> bool:
    """Whether a model of this name came from a Hugging Face directory (its reference is transformers')."""
    return name in ARCHITECTURES and ARCHITECTURES[name].origin == "hf"


def for_hf_model_type(model_type: object, where: str) -> Architecture:
    """The entry that imports a Hugging Face config.json of this model_type, or one line naming those tk imports."""
    for arch in ARCHITECTURES.values():
        if model_type in arch.hf_model_types:
            return arch
    known = ", ".join(f"{a.hf_class} (model_type {'/'.join(repr(t) for t in a.hf_model_types)})"
                      for a in ARCHITECTURES.values() if a.hf_model_types)
    raise UsageError(f"{where} has model_type {model_type!r}; tk imports {known} from Hugging Face")


def _declared_state(graphs: object) -> set[str]:
    """The decoder cache an adapter's config declares (its graphs as JSON); empty when that is malformed."""
    try:
        specs = json.loads(graphs) if isinstance(graphs, str) else None
        decoder = next(g for g in specs if isinstance(g, dict) and g.get("name") == "decoder")
        return set(decoder.get("updates", {}).values())
    except (TypeError, ValueError, StopIteration, AttributeError, RecursionError):
        return set()


def _hf_cache(config: dict) -> set[str]:
    return self_attention_cache(config["decoder_layers"])


# Every graph path tk has runs the ONNX graphs of an encoder-decoder in tk's cache layout; CTranslate2 and the browser
# read their own formats, converted per architecture.
_ALL = dict.fromkeys(("export", "verify", "int8", "cuda", "openvino"))
_TK_SEQ2SEQ = {**_ALL, "web": None}
_HF = "tk export hf:DIR"

register(Architecture(
    "transformer", SEQ2SEQ, lambda c: self_attention_cache(transformer_layers(c)[1]), ("num_layers",), ("sentencepiece",),
    "start <bos>, end <eos>, GNMT length penalty (alpha 0.6)", builder="toolkit.models.transformer",
    paths={**_TK_SEQ2SEQ, "ctranslate2": None}))
register(Architecture(
    "seq2seq", SEQ2SEQ, lambda c: {"state"}, (), ("sentencepiece",), "start <bos>, end <eos>, GNMT length penalty",
    builder="toolkit.models.seq2seq", paths=_TK_SEQ2SEQ))
register(Architecture(
    "adapter", SEQ2SEQ, lambda c: _declared_state(c.get("graphs")), (), ("sentencepiece",),
    "tk's rules over the graphs your function declared", origin="adapter", builder="toolkit.pytorch.adapter",
    paths=_ALL))
register(Architecture(
    "marian", SEQ2SEQ, _hf_cache, ("decoder_layers",), ("marian",),
    "start decoder_start_token_id (pad), end </s> forced at the limit, generate's beam rule and length penalty",
    origin="hf", hf_model_types=("marian",), hf_class="MarianMTModel", builder="toolkit.pytorch.hf_marian",
    paths={**_ALL, "ctranslate2": None}))
register(Architecture(
    "m2m100", SEQ2SEQ, _hf_cache, ("decoder_layers",), ("m2m100", "tokenizer.json"),
    "source [lang] text </s>; start </s> (decoder_start_token_id), the target language's token forced first, "
    "end </s> forced at the limit, generate's beam rule (M2M100 and NLLB-200)",
    origin="hf", hf_model_types=("m2m_100",), hf_class="M2M100ForConditionalGeneration",
    builder="toolkit.pytorch.hf_m2m100",
    paths={**_ALL, "ctranslate2": None}))
register(Architecture(
    "mbart", SEQ2SEQ, _hf_cache, ("decoder_layers",), ("mbart", "tokenizer.json"),
    "mBART-50: source [lang] text </s>, start </s>, the target language's token forced first; mBART-cc25: source "
    "text </s> [lang], the decoder started with the target language's token; end </s> forced at the limit, generate's "
    "beam rule", origin="hf", hf_model_types=("mbart",), hf_class="MBartForConditionalGeneration",
    builder="toolkit.pytorch.hf_mbart",
    paths={**_ALL, "ctranslate2": None,
           "web": "the browser site runs tk's own tokenizer and rules; translate an imported mBART with tk translate or tk serve"}))
for _name in ("masked_softmax", "dot_attention", "additive_attention", "multihead_attention", "nw"):
    register(Architecture(_name, MODULE, builder="toolkit.models.attention",
                          paths={"export": None, "verify": None, "int8": None, "cuda": None, "openvino": None}))
register(Architecture(
    "t5", SEQ2SEQ, _hf_cache, ("decoder_layers",), ("t5",),
    "source [task prefix of the chosen pair] text </s>; start <pad> (decoder_start_token_id 0), end </s>, no forced first "
    "token, generate's beam rule and length penalty (T5, T5 v1.1, Flan-T5, mT5)",
    origin="hf", hf_model_types=("t5", "mt5"), hf_class="T5ForConditionalGeneration", builder="toolkit.pytorch.hf_t5",
    paths={**_ALL, "ctranslate2": None,
           "web": "the browser site runs tk's own tokenizer and rules; translate an imported T5 with tk translate or tk serve"},
    # transformers clamps T5's hidden states when it runs in float16 because its feed-forward outputs pass float16's
    # 65,504 (T5 v1.1, Flan-T5 and mT5 were trained in bfloat16; CTranslate2 #1074 reports the garbage): a plain
    # float16 graph has no such clamp, so tk does not make one.
    refused_variants={"fp16": "a T5 model's activations overflow float16 (its feed-forward outputs pass 65,504; "
                              "transformers clamps them, an fp16 graph cannot): use the fp32 graphs, or --quantize "
                              "int8 on CPU"}))
