"""Your own PyTorch encoder-decoder in: `tk export MODULE:FUNCTION --out DIR` (or `tk export path/to/file.py:FUNCTION`).

FUNCTION() returns a `Seq2SeqAdapter`: the model, split as tk's graphs are, and what tk must know to run it.

    model.encode(src, src_len) -> dict of tensors
        src (batch, src_len) int64 token ids, src_len (batch,) int64 lengths; returns every tensor named in
        `encoder_outputs` (the decoder reads them at every step; src_len is passed on by tk).
    model.decode_step(token, state) -> (log_probs, state)
        token (batch,) int64, the last token; state: the encoder outputs, src_len and the tensors named in
        `decoder_state`; log_probs (batch, vocab_size) float32. A state with a "past_len" axis grows: it starts with 0
        positions and comes back one position longer (a key/value cache per layer, or simply the token prefix). A
        state without one has a fixed shape and is carried step to step (an RNN's hidden state): it starts as the
        encoder output of the same name when `encoder_outputs` names one, else as zeros, and comes back the same shape.

Dimensions are named "batch", "src_len" and "past_len" or given as numbers. tk exports the two graphs with those
axes dynamic, and everything downstream (verify, translate, serve, translate-corpus, bench, the variants, OpenVINO)
runs them as it runs its own models. The tokenizer is a SentencePiece model whose ids are the model's, shared by
both sides (its bos, eos and pad ids are the decoder's start, end and padding tokens), or a word-level vocabulary,
`WordVocab(tokens)` (toolkit.core.word_vocab: a token list with <unk>, <pad>, <bos>, <eos>, stored as JSON).
`source_end=True` appends the end token to every source, as the model was trained (d2l's `src <eos>`).

A model directory never makes tk import code: `tk verify DIR` on an adapter's export needs the same reference
given again (`--checkpoint MODULE:FUNCTION`), so running the user's code is always the user's explicit choice.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
from torch import nn

from toolkit.core.declaration import ADAPTER, Declaration, DecodingRules, TokenizerDeclaration
from toolkit.core.decode_options import shown
from toolkit.core.digests import file_sha256
from toolkit.core.errors import UsageError, first_line
from toolkit.core.graphs import SRC, GraphSpec, TensorSpec, decoder_graph, make_inputs
from toolkit.core.word_vocab import FILE as WORD_VOCAB_FILE
from toolkit.core.word_vocab import TARGET_FILE as TARGET_WORD_VOCAB_FILE
from toolkit.core.word_vocab import WordVocab
from toolkit.pytorch.registry import ModelEntry

DIMS = ("batch", "src_len", "past_len")
# The example batch the contract is checked on before export (all distinct and >= 2, as the exporter's own sizes are,
# so a swapped or fixed axis shows): a model that breaks the contract fails here in one line, not in torch.onnx's
# tracer or, worse, in every later translate.
TRIAL_SIZES = {"batch": 3, "src_len": 7, "past_len": 5}
TORCH_DTYPES = {"float32": torch.float32, "int64": torch.int64}


@dataclass
class Seq2SeqAdapter:
    """What `tk export MODULE:FUNCTION` needs of an encoder-decoder (see the module's docstring for the contract)."""

    model: nn.Module
    tokenizer: str | Path | WordVocab  # a SentencePiece model file, or a word-level vocabulary
    encoder_outputs: Mapping[str, tuple]  # name -> dims, e.g. {"memory": ("batch", "src_len", 256)}
    # name -> dims: with "past_len" a state that grows ({"prefix": ("batch", "past_len")}), without it one of fixed
    # shape ({"hidden": (2, "batch", 256)}), which starts as the encoder output of its name (or zeros)
    decoder_state: Mapping[str, tuple]
    vocab_size: int
    max_len: int  # the longest source and output, in tokens (the model's positions)
    integer: frozenset[str] = field(default_factory=frozenset)  # tensors of int64 (token ids); the others are float32
    length_penalty: str = "gnmt"  # tk's beam rule; "hf": Hugging Face's
    alpha: float = 0.6
    source_end: bool = False  # append the end token to every source (the model was trained on `text <eos>`)
    # The target side's word list where it is not the source's (d2l keeps a vocabulary per language): its <bos> and
    # <eos> start and end the decoder, and translate turns output ids into its words. None: one vocabulary.
    target_tokenizer: WordVocab | None = None

    def id_bound(self) -> int:
        """Token ids valid on both sides (the example batches' random ids stay below it)."""
        if isinstance(self.tokenizer, WordVocab):
            return min(self.vocab_size, len(self.tokenizer.tokens))
        return self.vocab_size


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
    except SystemExit as e:  # sys.exit() in the module: exiting silently with its status would hide why
        raise UsageError(f"importing {module_name} for {target} exited with status {shown(e.code)} (SystemExit) instead of "
                         "defining the function; remove the exit from the module's top level") from None
    except Exception as e:  # the user's module failed to import: its own error, in one line
        raise UsageError(f"cannot import {module_name} for {target}: {type(e).__name__}: {first_line(e, 120)}") from None
    built = getattr(module, function, None)
    if not callable(built):
        raise UsageError(f"{target}: {module_name} has no function {function}")
    return built


def _run(label: str, call: Callable, *args):
    """The user's code (`label` in messages), its failures one line each: an exception by its type and message,
    sys.exit() by its status (SystemExit would end tk silently, with the adapter's status)."""
    try:
        return call(*args)
    except UsageError:
        raise
    except SystemExit as e:
        raise UsageError(f"{label} exited with status {shown(e.code)} (SystemExit) instead of returning; "
                         "raise an exception (or return) instead of calling sys.exit") from None
    except Exception as e:
        raise UsageError(f"{label} failed: {type(e).__name__}: {first_line(e, 120)}") from None


def load(target: str) -> tuple[Seq2SeqAdapter, AdapterSettings]:
    """Calls TARGET() and checks what it returned against the contract, running the model once on an example batch."""
    adapter = _run(f"{target}()", resolve(target))
    if not isinstance(adapter, Seq2SeqAdapter):
        raise UsageError(f"{target}() returned {type(adapter).__name__}, not a toolkit.Seq2SeqAdapter (see docs/models.md)")
    check_fields(adapter, target)
    specs = graphs(adapter, target)
    tokenizer_rules(adapter, target)  # a tokenizer that cannot work is said before minutes of export
    adapter.model.eval()
    trial(adapter, specs, target)
    settings = AdapterSettings(target, adapter.id_bound(), adapter.max_len, json.dumps([s.to_dict() for s in specs]))
    return adapter, settings


def check_fields(adapter: Seq2SeqAdapter, target: str) -> None:
    """The adapter's fields, each of the type the contract names (a list where a dict is wanted was an AttributeError)."""
    if not isinstance(adapter.model, nn.Module):
        raise UsageError(f"{target}(): the model is a {type(adapter.model).__name__}, not a torch.nn.Module; make its class "
                         "subclass torch.nn.Module (tk exports its encode and decode_step with torch.onnx)")
    for method in ("encode", "decode_step"):
        if not callable(getattr(adapter.model, method, None)):
            raise UsageError(f"{target}(): the model has no {method} method (see docs/models.md for the contract)")
    for name in ("encoder_outputs", "decoder_state"):
        value = getattr(adapter, name)
        if not isinstance(value, Mapping):
            raise UsageError(f"{target}(): {name} is a {type(value).__name__}; give a dict of tensor name -> dims, "
                             "e.g. {'memory': ('batch', 'src_len', 256)}")
        for tensor, dims in value.items():
            if not isinstance(tensor, str) or not tensor.isidentifier():
                raise UsageError(f"{target}(): {name} has the key {shown(tensor)}; name each tensor with an identifier (a str)")
            if not isinstance(dims, (tuple, list)) or not dims:
                raise UsageError(f"{target}(): {name}[{tensor!r}] is {shown(dims)}; give its dims as a tuple, e.g. ('batch', 'src_len', 256)")
    integer = adapter.integer
    if isinstance(integer, str) or not isinstance(integer, (set, frozenset, list, tuple)) or not all(isinstance(n, str) for n in integer):
        raise UsageError(f"{target}(): integer is {shown(integer)}; give a set of tensor names, e.g. frozenset({{'prefix'}})")
    adapter.integer = frozenset(integer)
    if not isinstance(adapter.source_end, bool):
        raise UsageError(f"{target}(): source_end is {shown(adapter.source_end)}; give True or False")
    if adapter.target_tokenizer is not None and not (isinstance(adapter.target_tokenizer, WordVocab) and isinstance(adapter.tokenizer, WordVocab)):
        raise UsageError(f"{target}(): target_tokenizer is a {type(adapter.target_tokenizer).__name__}; give a toolkit.WordVocab, "
                         "with a WordVocab as tokenizer too (the source side's)")
    tokenizer = adapter.tokenizer
    if not isinstance(tokenizer, (str, os.PathLike, WordVocab)):
        fix = ("write the bytes to a file (Path('tokenizer.model').write_bytes(data)) and give its path"
               if isinstance(tokenizer, (bytes, bytearray))
               else "give the path of the SentencePiece model file, or toolkit.WordVocab(tokens) for a word list")
        raise UsageError(f"{target}(): tokenizer is a {type(tokenizer).__name__}, not the path of a SentencePiece model file; {fix}")
    from toolkit.core.manifest import size_problem

    for key in ("vocab_size", "max_len"):  # the manifest's bounds, checked before anything is exported
        problem = size_problem(key, getattr(adapter, key))
        if problem:
            raise UsageError(f"{target}(): {problem}")
    # tk's graphs are float32: float64 weights exported as they are made a graph that every translate then failed on.
    for name, tensor in [*adapter.model.named_parameters(), *adapter.model.named_buffers()]:
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            raise UsageError(f"{target}(): the model's weights are {str(tensor.dtype).removeprefix('torch.')} ({name}); tk exports "
                             "float32 graphs (--fp16 adds a half-precision copy): return model.float() from the function")


def _tensor(name: str, dims: tuple, integer: frozenset[str], fill: str = "normal") -> TensorSpec:
    for d in dims:
        if not (isinstance(d, int) and not isinstance(d, bool) and d > 0) and d not in DIMS:
            raise UsageError(f"tensor {name}: dimension {d!r} is neither a positive size nor one of {', '.join(DIMS)}")
    if "batch" not in dims:
        raise UsageError(f"tensor {name} has no 'batch' dimension")
    return TensorSpec(name, "int64" if name in integer else "float32", tuple(dims), fill)


def graphs(adapter: Seq2SeqAdapter, target: str) -> list[GraphSpec]:
    """The encoder and decoder declarations of an adapter, in tk's layout (toolkit.core.graphs.decoder_graph)."""
    if not adapter.encoder_outputs or not adapter.decoder_state:
        raise UsageError(f"{target}(): encoder_outputs and decoder_state must each name at least one tensor")
    clash = {"src", "src_len", "token", "log_probs"} & (set(adapter.encoder_outputs) | set(adapter.decoder_state))
    if clash:
        raise UsageError(f"{target}(): tensor name {sorted(clash)[0]!r} is one of tk's own; rename it")
    # A state the encoder also returns starts as the encoder's value (an RNN decoder's hidden state is the encoder's
    # last one): the encoder graph outputs it, and the decoder takes it as state, not as a constant of every step.
    for name in set(adapter.encoder_outputs) & set(adapter.decoder_state):
        if tuple(adapter.encoder_outputs[name]) != tuple(adapter.decoder_state[name]):
            raise UsageError(f"{target}(): {name} is in encoder_outputs as {tuple(adapter.encoder_outputs[name])} and in "
                             f"decoder_state as {tuple(adapter.decoder_state[name])}; the encoder's value is the state's start: "
                             "give both the same dims")
    for name, dims in adapter.encoder_outputs.items():
        if "past_len" in dims:
            raise UsageError(f"{target}(): encoder output {name} has a 'past_len' dimension; the encoder runs before any step")
    context = tuple(_tensor(n, tuple(d), adapter.integer) for n, d in adapter.encoder_outputs.items())
    state = tuple(_tensor(n, tuple(d), adapter.integer, "empty") for n, d in adapter.decoder_state.items())
    encoder = GraphSpec("encoder", SRC, context)
    return [encoder, decoder_graph(state, tuple(t for t in context if t.name not in adapter.decoder_state), adapter.vocab_size)]


def grows(dims: tuple) -> bool:
    """Whether a decoder state grows one position a step (a cache, the prefix) or keeps its shape (an RNN's state)."""
    return "past_len" in dims


GROWING_STATE = ("a state declared with 'past_len' grows one position per step (a key/value cache per layer, or the token "
                 "prefix); declare a state of fixed shape, such as an RNN's hidden state, without 'past_len', "
                 "e.g. (num_layers, 'batch', hidden)")


def trial(adapter: Seq2SeqAdapter, specs: list[GraphSpec], target: str) -> None:
    """Runs encode and one decode_step on an example batch and checks every tensor they return against the
    declaration: its type, dtype and shape, log_probs' vocabulary width, and each state one position longer."""
    encoder, decoder = specs
    sizes = TRIAL_SIZES
    rng = np.random.default_rng(0)
    feeds = {n: torch.from_numpy(v) for n, v in make_inputs(encoder, sizes, rng, adapter.id_bound()).items()}
    with torch.no_grad():
        out = _run(f"{target}: model.encode(src, src_len)", adapter.model.encode, feeds["src"], feeds["src_len"])
        _check_outputs(target, "model.encode", out, encoder.outputs, sizes, "encoder_outputs")
        state = {n: torch.from_numpy(v) for n, v in make_inputs(decoder, sizes, rng, adapter.id_bound()).items()}
        state.update({t.name: out[t.name] for t in encoder.outputs})
        state["src_len"] = feeds["src_len"]
        token = state.pop("token")
        answer = _run(f"{target}: model.decode_step(token, state)", adapter.model.decode_step, token, dict(state))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise UsageError(f"{target}: model.decode_step returned {type(answer).__name__}; return (log_probs, state)")
    log_probs, new_state = answer
    grown = {t.name.removeprefix("new_"): t for t in decoder.outputs[1:]}
    _check_outputs(target, "model.decode_step", {"log_probs": log_probs}, decoder.outputs[:1], sizes, "log_probs")
    for name in grown:
        before = tuple(state[name].shape)
        got = new_state.get(name) if isinstance(new_state, Mapping) else None
        if grows(adapter.decoder_state[name]) and isinstance(got, torch.Tensor) and tuple(got.shape) == before:
            raise UsageError(f"{target}: model.decode_step returned {name} with the shape it was given {before}, not one "
                             f"position longer; {GROWING_STATE}")
    _check_outputs(target, "model.decode_step's state", new_state, tuple(TensorSpec(n, t.dtype, t.dims) for n, t in grown.items()),
                   sizes, "decoder_state")


def _check_outputs(target: str, what: str, out: object, declared: tuple[TensorSpec, ...], sizes: dict, field_name: str) -> None:
    if not isinstance(out, Mapping):
        raise UsageError(f"{target}: {what} returned a {type(out).__name__}, not a dict of tensors by name; "
                         f"return {{name: tensor}} for every tensor of {field_name}")
    for t in declared:
        value = out.get(t.name)
        if not isinstance(value, torch.Tensor):
            got = "nothing" if value is None else f"a {type(value).__name__}"
            raise UsageError(f"{target}: {what} returned {got} for {t.name}; return a tensor for every name of {field_name}")
        if value.dtype != TORCH_DTYPES[t.dtype]:
            fix = "return model.float() from the function, or cast it" if value.is_floating_point() else "cast it"
            raise UsageError(f"{target}: {what} returned {t.name} as {str(value.dtype).removeprefix('torch.')}, not {t.dtype} "
                             f"as declared; {fix}" + (" (or list it in integer)" if t.dtype == "float32" and not value.is_floating_point() else ""))
        want = t.shape(sizes)
        if tuple(value.shape) != want:
            names = "(" + ", ".join(f"{d}={w}" if isinstance(d, str) else str(d) for d, w in zip(t.dims, want)) + ")"
            why = (f"its last dimension must be vocab_size {want[-1]}: the decoder's output over the whole vocabulary"
                   if t.name == "log_probs" and len(value.shape) == 2 and value.shape[0] == want[0] else "as declared")
            raise UsageError(f"{target}: {what} returned {t.name} of shape {tuple(value.shape)} on an example batch, "
                             f"expected {names}; {why}")


def tokenizer_rules(adapter: Seq2SeqAdapter, target: str) -> DecodingRules:
    """The decoding rules from the tokenizer's own special ids (a SentencePiece model's, or a word list's)."""
    if isinstance(adapter.tokenizer, WordVocab):
        source = adapter.tokenizer
        words = adapter.target_tokenizer or source
        if len(words.tokens) > adapter.vocab_size:
            raise UsageError(f"{target}(): the {'target ' if adapter.target_tokenizer else ''}word vocabulary has "
                             f"{len(words.tokens)} tokens, more than vocab_size {adapter.vocab_size}")
        # The source's <pad> pads source batches; the target's <bos> and <eos> start and end the decoder.
        return DecodingRules(start=words.special("bos"), end=words.special("eos"), pad=source.special("pad"),
                             length_penalty=adapter.length_penalty, alpha=adapter.alpha)
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
    """The tokenizer copied into the model directory (a word list as plain JSON), and the manifest sections it and the
    rules make."""
    rules = tokenizer_rules(adapter, settings.target)
    words = adapter.tokenizer if isinstance(adapter.tokenizer, WordVocab) else None
    extra, target_file = [], None
    if words is not None:
        file, kind, unk, what = WORD_VOCAB_FILE, "words", words.special("unk"), f"word list, split {words.split} (the adapter's)"
        (tmp / file).write_text(words.to_json(), encoding="utf-8")
        if adapter.target_tokenizer is not None:
            target_file = TARGET_WORD_VOCAB_FILE
            (tmp / target_file).write_text(adapter.target_tokenizer.to_json(), encoding="utf-8")
            extra.append({"file": target_file, "sha256": file_sha256(tmp / target_file)})
    else:
        file, kind, what = "tokenizer.model", "sentencepiece", "sentencepiece (the adapter's)"
        (tmp / file).write_bytes(Path(adapter.tokenizer).read_bytes())
        unk = max(spm.SentencePieceProcessor(model_file=str(tmp / file)).unk_id(), 0)
    declared = TokenizerDeclaration(kind, file, target=target_file, unk=unk, source_end=adapter.source_end)
    declaration = Declaration(rules, declared, origin=ADAPTER, placeholders=False)
    return {"declaration": declaration.to_dict(),
            "tokenizer": {"file": file, "sha256": file_sha256(tmp / file), "type": what},
            "special_tokens": {"pad": rules.pad, "bos": rules.start, "eos": rules.end, "unk": unk}, "extra_files": extra}


def build(settings: AdapterSettings) -> nn.Module:
    """Never from a manifest: the registry's builder of an adapter's model refuses, so that no model directory makes tk
    import code. The reference is given explicitly (`tk verify DIR --checkpoint MODULE:FUNCTION`)."""
    raise UsageError(f"this model was exported from {settings.target}; tk runs no code a model directory names: "
                     f"give it yourself with --checkpoint {settings.target}")


MODEL = ModelEntry("adapter", AdapterSettings, build, lambda cfg: cfg.specs(), random_init=False)
