"""Your own PyTorch encoder-decoder in: `tk export MODULE:FUNCTION --out DIR` (or `tk export path/to/file.py:FUNCTION`).

FUNCTION() returns a `Seq2SeqAdapter`: the model, split as tk's graphs are, and what tk must know to run it.

    model.encode(src, src_len) -> dict of tensors
        src (batch, src_len) int64 token ids, src_len (batch,) int64 lengths; returns every tensor named in
        `encoder_outputs` (the decoder reads them at every step; src_len is passed on by tk).
    model.decode_step(token, state) -> (log_probs, state)
        token (batch,) int64, the last token; state: the encoder outputs, src_len and the tensors named in
        `decoder_state`, which start with 0 positions on their "past_len" axis and come back one position longer
        (a key/value cache per layer, or simply the token prefix); log_probs (batch, vocab_size) float32.

Dimensions are named "batch", "src_len" and "past_len" or given as numbers. tk exports the two graphs with those
axes dynamic, and everything downstream (verify, translate, serve, translate-corpus, bench, the variants, OpenVINO)
runs them as it runs its own models. The tokenizer is a SentencePiece model whose ids are the model's, shared by
both sides; its bos, eos and pad ids are the decoder's start, end and padding tokens.

A model directory never makes tk import code: `tk verify DIR` on an adapter's export needs the same reference
given again (`--checkpoint MODULE:FUNCTION`), so running the user's code is always the user's explicit choice.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece as spm
from torch import nn

from toolkit.core.declaration import Declaration, DecodingRules, TokenizerDeclaration
from toolkit.core.digests import file_sha256
from toolkit.core.errors import UsageError, first_line
from toolkit.core.graphs import SRC, GraphSpec, TensorSpec, decoder_graph

DIMS = ("batch", "src_len", "past_len")


@dataclass
class Seq2SeqAdapter:
    """What `tk export MODULE:FUNCTION` needs of an encoder-decoder (see the module's docstring for the contract)."""

    model: nn.Module
    tokenizer: str | Path  # a SentencePiece model file
    encoder_outputs: Mapping[str, tuple]  # name -> dims, e.g. {"memory": ("batch", "src_len", 256)}
    decoder_state: Mapping[str, tuple]  # name -> dims with "past_len", e.g. {"prefix": ("batch", "past_len")}
    vocab_size: int
    max_len: int  # the longest source and output, in tokens (the model's positions)
    integer: frozenset[str] = field(default_factory=frozenset)  # tensors of int64 (token ids); the others are float32
    length_penalty: str = "gnmt"  # tk's beam rule; "hf": Hugging Face's
    alpha: float = 0.6


@dataclass
class AdapterSettings:
    """The manifest's "config" of an adapter's export: where it came from and its graphs' declarations (JSON)."""

    target: str = ""  # MODULE:FUNCTION as given to tk export
    vocab_size: int = 8
    max_len: int = 64
    graphs: str = "[]"  # the encoder and decoder GraphSpecs, as JSON

    def specs(self) -> list[GraphSpec]:
        return [GraphSpec.from_dict(g) for g in json.loads(self.graphs)]


def is_target(source: str) -> bool:
    """Whether `tk export SOURCE` names an adapter (MODULE:FUNCTION or FILE.py:FUNCTION) rather than a file."""
    module, sep, function = source.rpartition(":")
    return bool(sep and module and function.isidentifier() and not Path(source).exists())


def resolve(target: str):
    """The function TARGET names. The current directory is searched first, as uvicorn and pytest do, so that a
    project's own package needs no install."""
    module_name, _, function = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"{target}: {path} is not a file")
            spec = importlib.util.spec_from_file_location(f"tk_adapter_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as e:  # the user's module failed to import: its own error, in one line
        raise UsageError(f"cannot import {module_name} for {target}: {type(e).__name__}: {first_line(e, 120)}") from None
    built = getattr(module, function, None)
    if not callable(built):
        raise UsageError(f"{target}: {module_name} has no function {function}")
    return built


def load(target: str) -> tuple[Seq2SeqAdapter, AdapterSettings]:
    """Calls TARGET() and checks what it returned against the contract."""
    try:
        adapter = resolve(target)()
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"{target}() failed: {type(e).__name__}: {first_line(e, 120)}") from None
    if not isinstance(adapter, Seq2SeqAdapter):
        raise UsageError(f"{target}() returned {type(adapter).__name__}, not a toolkit.Seq2SeqAdapter (see docs/models.md)")
    for method in ("encode", "decode_step"):
        if not callable(getattr(adapter.model, method, None)):
            raise UsageError(f"{target}(): the model has no {method} method (see docs/models.md for the contract)")
    from toolkit.core.manifest import size_problem

    for key in ("vocab_size", "max_len"):  # the manifest's bounds, checked before anything is exported
        problem = size_problem(key, getattr(adapter, key))
        if problem:
            raise UsageError(f"{target}(): {problem}")
    specs = graphs(adapter, target)
    settings = AdapterSettings(target, adapter.vocab_size, adapter.max_len, json.dumps([s.to_dict() for s in specs]))
    adapter.model.eval()
    return adapter, settings


def _tensor(name: str, dims: tuple, integer: frozenset[str], fill: str = "normal") -> TensorSpec:
    for d in dims:
        if not (isinstance(d, int) and not isinstance(d, bool) and d > 0) and d not in DIMS:
            raise UsageError(f"tensor {name}: dimension {d!r} is neither a positive size nor one of {', '.join(DIMS)}")
    if "batch" not in dims:
        raise UsageError(f"tensor {name} has no 'batch' dimension")
    return TensorSpec(name, "int64" if name in integer else "float32", tuple(dims), fill)


def graphs(adapter: Seq2SeqAdapter, target: str) -> list[GraphSpec]:
    """The encoder and decoder declarations of an adapter, in tk's layout (toolkit.pytorch.registry._decoder_graph)."""
    if not adapter.encoder_outputs or not adapter.decoder_state:
        raise UsageError(f"{target}(): encoder_outputs and decoder_state must each name at least one tensor")
    clash = set(adapter.encoder_outputs) & set(adapter.decoder_state) | ({"src", "src_len", "token", "log_probs"} &
                                                                            (set(adapter.encoder_outputs) | set(adapter.decoder_state)))
    if clash:
        raise UsageError(f"{target}(): tensor name {sorted(clash)[0]!r} is used twice or is one of tk's own")
    for name, dims in adapter.decoder_state.items():
        if "past_len" not in dims:
            raise UsageError(f"decoder_state {name} has no 'past_len' dimension: the state grows one position per step")
    context = tuple(_tensor(n, tuple(d), adapter.integer) for n, d in adapter.encoder_outputs.items())
    state = tuple(_tensor(n, tuple(d), adapter.integer, "empty") for n, d in adapter.decoder_state.items())
    encoder = GraphSpec("encoder", SRC, context)
    return [encoder, decoder_graph(state, context, adapter.vocab_size)]


def tokenizer_rules(adapter: Seq2SeqAdapter, target: str) -> DecodingRules:
    """The decoding rules from the SentencePiece model's own special ids."""
    path = Path(adapter.tokenizer)
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise UsageError(f"{target}(): tokenizer {path} is not a SentencePiece model ({first_line(e, 80)})") from None
    if sp.bos_id() < 0 or sp.eos_id() < 0:
        raise UsageError(f"{target}(): tokenizer {path} has no bos or eos piece; train it with bos_id and eos_id set")
    if sp.get_piece_size() > adapter.vocab_size:
        raise UsageError(f"{target}(): tokenizer {path} has {sp.get_piece_size()} pieces, more than vocab_size {adapter.vocab_size}")
    return DecodingRules(start=sp.bos_id(), end=sp.eos_id(), pad=max(sp.pad_id(), 0), length_penalty=adapter.length_penalty,
                         alpha=adapter.alpha)


def write_files(adapter: Seq2SeqAdapter, settings: AdapterSettings, tmp: Path) -> dict:
    """The tokenizer copied into the model directory, and the manifest sections it and the rules make."""
    rules = tokenizer_rules(adapter, settings.target)
    (tmp / "tokenizer.model").write_bytes(Path(adapter.tokenizer).read_bytes())
    declaration = Declaration(rules, TokenizerDeclaration("sentencepiece", "tokenizer.model"), origin="adapter", placeholders=False)
    return {"declaration": declaration.to_dict(),
            "tokenizer": {"file": "tokenizer.model", "sha256": file_sha256(tmp / "tokenizer.model"), "type": "sentencepiece (the adapter's)"},
            "special_tokens": {"pad": rules.pad, "bos": rules.start, "eos": rules.end}}


def build(settings: AdapterSettings) -> nn.Module:
    """Never from a manifest: the registry's builder of an adapter's model refuses, so that no model directory makes tk
    import code. The reference is given explicitly (`tk verify DIR --checkpoint MODULE:FUNCTION`)."""
    raise UsageError(f"this model was exported from {settings.target}; tk runs no code a model directory names: "
                     f"give it yourself with --checkpoint {settings.target}")
