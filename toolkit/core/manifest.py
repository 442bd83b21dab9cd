"""manifest.json: an exported model directory describes itself. Torch-free: translate reads it."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path

from toolkit.core.architectures import ARCHITECTURES, SEQ2SEQ, SIZES
from toolkit.core.architectures import GRAPHS as ARCHITECTURE_GRAPHS
from toolkit.core.atomic import exclusive, not_a_file, write_atomic
from toolkit.core.declaration import Declaration, DecodingRules
from toolkit.core.decode_options import shown
from toolkit.core.digests import file_sha256
from toolkit.core.errors import UsageError
from toolkit.core.graphs import GraphSpec
from toolkit.core.variants import BUILT, PLAIN

FORMAT = "tk-export/1"
# Revision of the layout within the format; `migrate` brings older manifests up to it.
VERSION = 3
NAME = "manifest.json"


@dataclass
class FileRecord:
    file: str
    sha256: str
    bytes: int | None = None


@dataclass
class GraphRecord:
    """One exported fp32 graph: its file, digest, declaration and (shared) external weights file."""

    file: str
    sha256: str
    spec: dict
    bytes: int | None = None
    weights: FileRecord | None = None


@dataclass
class VariantRecord:
    """A stored variant's graphs (see toolkit.core.variants for what each variant is)."""

    graphs: dict[str, FileRecord]
    provider: str | None = None
    note: str | None = None
    command: str | None = None


@dataclass
class TokenizerRecord:
    file: str
    sha256: str
    type: str | None = None


@dataclass
class CheckpointRecord:
    """What the graphs were exported from: a checkpoint (path and digest) or a seeded random init."""

    weights_sha256: str
    path: str | None = None
    sha256: str | None = None
    checkpoint_weights_sha256: str | None = None  # the digest the checkpoint itself carried
    random_init: bool | None = None
    seed: int | None = None


@dataclass
class TrainingRecord:
    """Training provenance, copied from the checkpoint at export."""

    command: str | None = None
    seed: int | None = None
    hardware: str | None = None
    options: dict | None = None
    resumed_with: list | None = None
    noise: dict | None = None
    recipe: dict | None = None
    elapsed_s: float | None = None
    history: list | None = None
    data: dict | None = None


@dataclass
class VerificationRecord:
    """`tk verify --record`: the verdict and the worst error per (check, variant, provider)."""

    passed: bool
    checks: int
    failures: int
    seed: int
    seconds: float
    reference: str
    environment: dict
    skipped_providers: dict
    worst: dict


@dataclass
class ConversionRecord:
    """The model converted for a runtime that does not run ONNX graphs (`tk export DIR --ctranslate2`). Its files keep
    plain names in the directory (a runtime's own name, prefixed: ctranslate2.model.bin) and load from there by the
    runtime's own names, the keys of `files`."""

    files: dict[str, FileRecord]
    version: str | None = None  # of the converting runtime
    command: str | None = None


@dataclass
class ShortlistRecord:
    """A lexical shortlist stored beside the graphs (`tk export DIR --shortlist FILE`; toolkit.core.shortlist): its
    file, how it was made, and its sizes."""

    file: str
    sha256: str
    made_from: str  # the text it was estimated from: "FILE (N sentences, the model's own translations)"
    per_token: int
    frequent: int
    sizes: dict | None = None
    command: str | None = None
    # `tk verify DIR --shortlist --record`: its verdict per variant ("fp32", "int8"): accepted, identical share, sentences
    checked: dict | None = None


# JSON key -> field name where the two differ (a method or a clearer name took the key).
RENAMED = {"variants": "stored", "verify": "verification"}


@dataclass
class Manifest:
    """A model directory's manifest.json, typed. Load with `load`, change its sections, then `save()`."""

    directory: Path
    model: str
    kind: str
    config: dict
    graphs: dict[str, GraphRecord]
    version: int  # of the layout: `migrate` brings an older manifest up to VERSION before this is built
    stored: dict[str, VariantRecord] = field(default_factory=dict)  # "variants": the variants stored beside fp32
    tokenizer: TokenizerRecord | None = None
    special_tokens: dict[str, int] | None = None
    checkpoint: CheckpointRecord | None = None
    training: TrainingRecord | None = None
    metrics: dict = field(default_factory=dict)  # name -> result, e.g. "evaluation", "evaluation_int8"
    # "verify": one record per "runtime/provider" ("onnxruntime/cpu", "onnxruntime/cuda", "openvino/cpu"),
    # so that verifying on one never erases the evidence of another.
    verification: dict[str, VerificationRecord] = field(default_factory=dict)
    extra_files: list[FileRecord] = field(default_factory=list)
    converted: dict[str, ConversionRecord] | None = None  # runtime -> its converted copy of the weights
    attention: dict | None = None  # graph -> declared attention outputs
    # The model's decoding rules and tokenizer (toolkit.core.declaration); None: tk's own (every manifest before it).
    declaration: dict | None = None
    # How far to trust each translation (toolkit.core.confidence): the map `tk evaluate --calibrate` fitted on held-out
    # sentences; None: the uncalibrated default.
    confidence: dict | None = None
    shortlist: ShortlistRecord | None = None  # candidates per source token (`tk translate --shortlist`)
    opset: int | None = None
    versions: dict | None = None
    export_command: str | None = None
    created: str | None = None

    @classmethod
    def from_dict(cls, directory: str | Path, data: dict) -> Manifest:
        """The typed manifest; an unknown, missing or mistyped field is a UsageError naming the file and field."""
        directory = Path(directory)
        where = directory / NAME
        body = {RENAMED.get(k, k): v for k, v in data.items() if k != "format"}
        return _build(cls, {"directory": directory, **body}, "", where)

    def to_dict(self) -> dict:
        """The JSON layout (fields left None are omitted)."""
        out = {"format": FORMAT}
        for f in fields(self):
            if f.name == "directory":
                continue
            value = _plain(getattr(self, f.name))
            if value is not None:
                out[{v: k for k, v in RENAMED.items()}.get(f.name, f.name)] = value
        return out

    def save(self) -> None:
        """Atomically: a crash mid-write (or a full disk) leaves the previous manifest intact."""
        try:
            data = self.to_dict()
            text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        except RecursionError:  # a section read from a manifest nested just short of the parser's limit
            raise UsageError(f"{self.directory / NAME} is corrupt: a section nests too deeply to write; re-export the model directory") from None
        problem = schema_problem(data)
        if problem:
            raise ValueError(f"refusing to write an invalid {self.directory / NAME}: {problem}")
        write_atomic(self.directory / NAME, text.encode("utf-8"))

    @property
    def max_len(self) -> int:
        return int(self.config.get("max_len", 64))

    def declared(self) -> Declaration:
        """The model's declaration: its own, or tk's rules for a directory written before declarations. Parsed once per
        declaration (translate_batch reads it at every call, a single request included)."""
        cached = self.__dict__.get("_declared")
        if cached is None or cached[0] is not self.declaration:
            parsed = Declaration() if self.declaration is None else Declaration.from_dict(self.declaration, str(self.directory / NAME))
            self._check_token_ids(parsed.decoding)
            cached = self.__dict__["_declared"] = (self.declaration, parsed)
        return cached[1]

    def output_vocab(self) -> int | None:
        """The tokens the decoder scores: the declared width of its log_probs output (None: no such output). A width
        that is not a whole number of at least 1 is refused in one line (an edited manifest's "" failed as a TypeError
        where the browser page's glossary tables are made)."""
        decoder = self.graphs.get("decoder")
        spec = decoder.spec if decoder is not None and isinstance(decoder.spec, dict) else {}
        outputs = spec.get("outputs") if isinstance(spec.get("outputs"), list) else []
        dims = next((o.get("dims") for o in outputs if isinstance(o, dict) and o.get("name") == "log_probs"), None)
        if dims is None:
            return None
        last = dims[-1] if isinstance(dims, list) and dims else None
        if type(last) is int and last >= 1:
            return last
        if isinstance(last, str) and last:
            return None  # a named axis: the width is the graph's to say
        raise UsageError(f"{self.directory / NAME}: the decoder's log_probs output is declared {dims!r}, its last axis "
                         "not a number of tokens; re-export the model directory")

    def _check_token_ids(self, rules: DecodingRules) -> None:
        """The decoding rules' target tokens must be tokens the decoder scores (output_vocab): an edited manifest's
        forced_first of 6000 for a vocabulary of 6000 failed as an IndexError in the decoding loop."""
        vocab = self.output_vocab()
        if vocab is None:
            return
        for name in ("start", "end", "forced_first"):
            value = getattr(rules, name)
            if value is not None and value >= vocab:
                raise UsageError(f"{self.directory / NAME}: declaration.decoding.{name} is {value}, not a token of this model "
                                 f"(its decoder scores {vocab:,} tokens); re-export the model directory")

    def rules(self) -> DecodingRules:
        """How this model is decoded (start and end tokens, length penalty), whatever runs its graphs."""
        return self.declared().decoding

    @property
    def max_output_len(self) -> int:
        """Output tokens unless the caller gives a limit: the declared default, within the model's positions."""
        limit = self.rules().max_new_tokens
        return self.max_len if limit is None else min(limit, self.max_len)

    def specs(self) -> dict[str, GraphSpec]:
        return {name: GraphSpec.from_dict(g.spec) for name, g in self.graphs.items()}

    @functools.cached_property  # read at every call of the API
    def cache_width(self) -> int | None:
        """Floats per row and position of the decoder's cache (the inputs its outputs replace at each step), from the
        decoder's declared shapes; None without a decoder."""
        decoder = self.specs().get("decoder")
        if decoder is None:
            return None
        cached = set(decoder.updates.values())
        return sum(math.prod(d for d in t.dims if isinstance(d, int)) for t in decoder.inputs if t.name in cached)

    def variants(self) -> list[str]:
        return [PLAIN, *self.stored]

    def variants_for(self, provider: str) -> list[str]:
        """fp32 and the variants exported for this provider (fp16 for cuda; optimized and int8 for cpu)."""
        return [PLAIN, *(v for v, d in self.stored.items() if d.provider == provider)]

    def graph_path(self, graph: str, variant: str = PLAIN) -> Path:
        if variant != PLAIN and variant not in self.stored:
            have = ", ".join(self.variants())
            raise UsageError(f"{self.directory} has no {variant} variant (has: {have}); re-export with the matching option")
        entry = self.graphs[graph] if variant == PLAIN else self.stored[variant].graphs[graph]
        return self.directory / entry.file

    def tokenizer_path(self) -> Path | None:
        return self.directory / self.tokenizer.file if self.tokenizer else None

    def translation_tokenizer(self) -> Path:
        """The tokenizer of a translation model; a usage error for any other directory."""
        if self.kind != SEQ2SEQ:
            raise UsageError(f"{self.directory} holds a '{self.model}' graph, not a translation model; "
                             "use exported/transformer or exported/seq2seq")
        path = self.tokenizer_path()
        if path is None:
            raise UsageError(f"{self.directory} has no tokenizer (exported with --random-init); export a trained checkpoint")
        return path

    def check_kinds(self) -> None:
        """No file the manifest lists is a FIFO, a device or a directory, asked of stat alone before anything opens one:
        reading a FIFO blocks for ever, and /dev/zero never ends."""
        for rel in self.files():
            path = self.directory / rel
            kind = not_a_file(path)
            if kind is not None:
                raise UsageError(f"{path} is {kind}, not a regular file{_link_note(path)}; {NAME} lists it as one of the model's "
                                 "files: put the exported file back or re-export the model directory")

    def check_files(self, cached: bool = False) -> None:
        """Every file the manifest lists is a regular file, exists and has the recorded sha256.
        cached: a file unchanged since it was last hashed is not hashed again (toolkit.core.load_cache)."""
        self.check_kinds()
        paths = {}
        for rel, digest in self.files().items():
            path = self.directory / rel
            if not path.is_file():
                raise UsageError(f"{path} is listed in {NAME} but missing; re-export the model directory")
            paths[path] = digest
        if cached:
            from toolkit.core.load_cache import file_digests

            got = file_digests(list(paths))
        for path, digest in paths.items():
            if (got[path] if cached else file_sha256(path)) != digest:
                raise UsageError(f"{path} does not match the sha256 in {NAME} (modified or corrupt); re-export it")

    def files(self) -> dict[str, str]:
        out = {g.file: g.sha256 for g in self.graphs.values()}
        out.update({g.weights.file: g.weights.sha256 for g in self.graphs.values() if g.weights})
        for v in self.stored.values():
            out.update({g.file: g.sha256 for g in v.graphs.values()})
        out.update({e.file: e.sha256 for e in self.extra_files})
        for c in (self.converted or {}).values():
            out.update({f.file: f.sha256 for f in c.files.values()})
        if self.tokenizer:
            out[self.tokenizer.file] = self.tokenizer.sha256
        if self.shortlist:
            out[self.shortlist.file] = self.shortlist.sha256
        return out


def _plain(value):
    """Typed sections back to JSON data, dropping fields left None."""
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value) if getattr(value, f.name) is not None}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _build(cls, data, where: str, path: Path):
    """Instance of dataclass `cls` from JSON data: every field checked against its type hint."""
    if not isinstance(data, dict):
        raise UsageError(f"{path}: '{where}' must be a JSON object; re-export the model directory")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        key = {v: k for k, v in RENAMED.items()}.get(unknown[0], unknown[0]) if cls is Manifest else unknown[0]
        raise UsageError(f"{path}: unknown field '{where}{key}' (written by a newer tk?); re-export the model directory")
    values = {}
    for f in fields(cls):
        name = {v: k for k, v in RENAMED.items()}.get(f.name, f.name) if cls is Manifest else f.name
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise UsageError(f"{path}: required field '{where}{name}' is missing; re-export the model directory")
            continue
        values[f.name] = _value(hints[f.name], data[f.name], f"{where}{name}", path)
    return cls(**values)


def _value(hint, value, where: str, path: Path):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        return _build(hint, value, f"{where}.", path)
    if origin is dict:
        if not isinstance(value, dict):
            raise UsageError(f"{path}: '{where}' must be a JSON object; re-export the model directory")
        return {k: _value(args[1], v, f"{where}.{k}", path) for k, v in value.items()} if args else value
    if origin is list:
        if not isinstance(value, list):
            raise UsageError(f"{path}: '{where}' must be a JSON list; re-export the model directory")
        return [_value(args[0], v, f"{where}[{i}]", path) for i, v in enumerate(value)] if args else value
    accepted = {float: (int, float), int: (int,)}.get(hint, (hint,))
    if hint is Path:
        return value
    if not isinstance(value, accepted) or (isinstance(value, bool) and hint is not bool):
        raise UsageError(f"{path}: '{where}' must be a JSON {JSON_NAMES.get(hint, hint.__name__)}, got {value!r:.40}; "
                         "re-export the model directory")
    return value


JSON_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "list"}


def migrate(data: dict, path: Path) -> dict:
    """The manifest in the current layout. Version 1 (before the version field) has version 2's layout;
    version 2 held one verification record, version 3 one per runtime and provider. A newer version
    than this tk knows is refused."""
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"{path}: 'version' must be a positive integer, got {version!r}; re-export the model directory")
    if version > VERSION:
        raise UsageError(f"{path} has manifest version {version}, this tk reads up to {VERSION}; upgrade tk")
    if version == 1:
        data = {**data, "version": 2}
    if data["version"] == 2:
        data = {**data, "version": 3}
        if isinstance(data.get("verify"), dict):
            data["verify"] = split_verification(data["verify"])
    return data


def verification_key(runtime: str, provider: str) -> str:
    """'onnxruntime/cpu', 'openvino/cpu': a report row's provider column is 'cpu', 'cuda' or 'openvino-cpu'."""
    return f"{runtime}/{provider.split('-', 1)[-1]}"


# Version 2 records named the runtime only in other runtimes' rows ("openvino-cpu"); rows without were this one's.
V2_PLAIN_RUNTIME = "onnxruntime"


def split_verification(record: dict) -> dict[str, dict]:
    """A version-2 verification record (every provider of one run together) as version 3's per-provider records."""
    providers = sorted({key.split("/")[2] for key in record.get("worst", {})}) or list(record.get("environment", {}).get("providers", ["cpu"]))
    out = {}
    for p in providers:
        worst = {k: v for k, v in record.get("worst", {}).items() if k.split("/")[2] == p}
        failures = sum(w.get("failed", 0) for w in worst.values())
        runtime = p.rpartition("-")[0] or V2_PLAIN_RUNTIME  # a row of another runtime than the default says which: "openvino-cpu"
        out[verification_key(runtime, p)] = {**record, "worst": worst, "passed": record.get("passed", False) and not failures,
                                             "checks": sum(w.get("checks", 0) for w in worst.values()) or record.get("checks", 0),
                                             "failures": failures}
    return out


def _link_note(path: Path) -> str:
    return f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""


def load(directory: str | Path) -> Manifest:
    directory = Path(directory)
    try:
        str(directory.resolve()).encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 in the name: ONNX Runtime and OpenVINO cannot open such paths
        raise UsageError(f"model directory {str(directory)!r} has a path that is not valid UTF-8; rename it (or move it) "
                         "to a UTF-8 path") from None
    path = directory / NAME
    if not directory.is_dir():
        if directory.exists():  # a file where the directory belongs: its manifest.json, say
            kind = not_a_file(directory) or "a file"
            fix = f"give its directory {directory.parent}" if directory.name == NAME else "give the directory `tk export` wrote"
            raise UsageError(f"{directory} is {kind}, not a model directory; {fix}")
        raise UsageError(f"model directory {directory} does not exist; export one with `tk export`")
    if not path.is_file():
        kind = not_a_file(path)
        if kind is not None:  # never read: a FIFO would block, /dev/zero never ends
            raise UsageError(f"{path} is {kind}, not a regular file{_link_note(path)}; a model directory's {NAME} is the file "
                             "`tk export` wrote: put it back or re-export the model directory")
        raise UsageError(f"{directory} has no {NAME}; it is not an exported tk model (run `tk export` to make one)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e}); re-export the model directory") from None
    except RecursionError:  # brackets nested thousands deep: the parser gives up, and no manifest nests like that
        raise UsageError(f"{path} is corrupt: its JSON nests too deeply to read; re-export the model directory") from None
    except OSError as e:
        raise UsageError(f"cannot read {path} ({e.strerror}); re-export the model directory") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an object; re-export the model directory")
    if data.get("format") != FORMAT:
        raise UsageError(f"{path} has format {data.get('format')!r}, expected {FORMAT!r}; re-export with this tk")
    data = migrate(data, path)
    problem = schema_problem(data)
    if problem:
        raise UsageError(f"{path} is corrupt or not a tk manifest: {problem}; re-export the model directory")
    return Manifest.from_dict(directory, data)


GRAPHS = {kind: set(names) for kind, names in ARCHITECTURE_GRAPHS.items()}
SHA256 = re.compile(r"[0-9a-f]{64}")
DTYPES = {"float32", "float16", "int64"}


def _file_problem(entry, where: str) -> str | None:
    if not isinstance(entry, dict):
        return f"{where} is not an object"
    name, digest = entry.get("file"), entry.get("sha256")
    # A plain name inside the directory: a manifest must not point tk at files elsewhere.
    if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
        return f"{where}.file must be a file name inside the model directory, got {name!r}"
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        return f"{where}.sha256 must be 64 hex digits"
    return None


_AXIS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\+[0-9]+)?")


def _dim_ok(d) -> bool:
    """An axis of a declared tensor: a size (a whole number of at least 0) or a name ("batch", "past_len+1")."""
    return (type(d) is int and d >= 0) or (isinstance(d, str) and _AXIS.fullmatch(d) is not None)


def _spec_problem(spec, where: str) -> str | None:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return f"{where} is not a graph declaration"
    for side in ("inputs", "outputs"):
        tensors = spec.get(side)
        if not isinstance(tensors, list) or not tensors:
            return f"{where}.{side} must be a non-empty list"
        for t in tensors:
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("dtype"), str) and t["dtype"] in DTYPES
                    and isinstance(t.get("dims"), list) and all(map(_dim_ok, t["dims"]))
                    and isinstance(t.get("fill"), str)):
                return f"{where}.{side} has a malformed tensor {str(t)[:60]}"
    names = {side: [t["name"] for t in spec[side]] for side in ("inputs", "outputs")}
    for side, got in names.items():
        if "" in got or len(set(got)) != len(got):
            return f"{where}.{side} names must be non-empty and distinct"
    updates = spec.get("updates", {})
    if not isinstance(updates, dict):
        return f"{where}.updates must be an object"
    if not all(k in names["outputs"] and v in names["inputs"] for k, v in updates.items()):
        return f"{where}.updates must map outputs to inputs of the same graph"
    return None


def schema_problem(data: dict) -> str | None:
    """What is wrong with a parsed manifest (required keys, types, model vs graphs), or None."""
    for key, kind in (("model", str), ("kind", str), ("config", dict), ("graphs", dict)):
        if key not in data:
            return f"required key '{key}' is missing"
        if not isinstance(data[key], kind):
            return f"'{key}' must be a JSON {'string' if kind is str else 'object'}"
    if data["model"] not in ARCHITECTURES:  # read at each load: an architecture registered later is known too
        return f"unknown model type '{data['model']}' (known: {', '.join(ARCHITECTURES)})"
    kind, cache = ARCHITECTURES[data["model"]].kind, ARCHITECTURES[data["model"]].cache
    if data["kind"] != kind:
        return f"model '{data['model']}' is a {kind} model, but kind says '{data['kind']}'"
    if set(data["graphs"]) != set(ARCHITECTURE_GRAPHS[kind]):
        return f"a {kind} model has graphs {sorted(GRAPHS[kind])}, this one lists {sorted(data['graphs'])}"
    problem = _sizes_problem(data["config"], data["model"])
    if problem:
        return problem
    for name, g in data["graphs"].items():
        problem = _file_problem(g, f"graphs.{name}") or _spec_problem(g.get("spec"), f"graphs.{name}.spec")
        if not problem and "weights" in g:
            problem = _file_problem(g["weights"], f"graphs.{name}.weights")
        if problem:
            return problem
    if cache is not None:
        got = set(data["graphs"]["decoder"]["spec"].get("updates", {}).values())
        if got != cache(data["config"]):
            return f"its graphs carry the cache {sorted(got)}, which is not a '{data['model']}' model's {sorted(cache(data['config']))}"
    problem = _variants_problem(data.get("variants", {}), set(data["graphs"]))
    if problem:
        return problem
    for key in ("tokenizer", "shortlist"):
        problem = _file_problem(data[key], key) if data.get(key) is not None else None
        if problem:
            return problem
    extra = data.get("extra_files", [])
    if not isinstance(extra, list):
        return "'extra_files' must be a list"
    for i, e in enumerate(extra):
        problem = _file_problem(e, f"extra_files[{i}]")
        if problem:
            return problem
    problem = _converted_problem(data.get("converted"))
    if problem:
        return problem
    problem = _attention_problem(data.get("attention"), set(data["graphs"]))
    if problem:
        return problem
    problem = _declaration_problem(data.get("declaration"))
    if problem:
        return problem
    if data.get("confidence") is not None:
        from toolkit.core.confidence import calibration_problem

        problem = calibration_problem(data["confidence"])
        if problem:
            return f"confidence {problem}"
    for key in ("checkpoint", "training", "metrics", "versions", "verify"):
        if key in data and data[key] is not None and not isinstance(data[key], dict):
            return f"'{key}' must be an object"
    return None


def size_problem(key: str, value: object, name: str | None = None) -> str | None:
    """What is wrong with size `key` of a config (named `name` in the message), or None: a whole number within SIZES."""
    low, high = SIZES[key]
    name = name or key
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{name} must be a whole number from {low} to {high}, got {shown(value)}"
    if value < low:
        return f"{name} must be at least {low}, got {shown(value)}"
    if value > high:
        return f"{name} must be at most {high} (the largest tk builds), got {shown(value)}"
    return None


def _sizes_problem(config: dict, model: str) -> str | None:
    missing = next((key for key in ARCHITECTURES[model].required if key not in config), None)
    if missing is not None:
        return f"config.{missing} is missing"  # its decoder cache is one entry per layer
    for key in SIZES:
        if key in config:
            problem = size_problem(key, config[key], f"config.{key}")
            if problem:
                return problem
    return None


def _variants_problem(variants, graphs: set[str]) -> str | None:
    if not isinstance(variants, dict):
        return "'variants' must be an object"
    for v, d in variants.items():
        if v not in BUILT or not isinstance(d, dict) or not isinstance(d.get("graphs"), dict):
            return f"variants.{v} is not a known variant with graphs"
        if set(d["graphs"]) != graphs:
            return f"variants.{v} lists graphs {sorted(d['graphs'])}, not {sorted(graphs)}"
        for name, g in d["graphs"].items():
            problem = _file_problem(g, f"variants.{v}.graphs.{name}")
            if problem:
                return problem
    return None


RUNTIME_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


def _converted_problem(converted) -> str | None:
    if converted is None:
        return None
    if not isinstance(converted, dict):
        return "'converted' must be an object"
    for runtime, record in converted.items():
        # Any runtime's name (each reads only its own record, registered in toolkit.runtimes.registry), never a path.
        if not RUNTIME_NAME.fullmatch(runtime) or not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            return f"converted.{runtime} is not a runtime's converted model with files"
        for name, entry in record["files"].items():
            problem = _file_problem(entry, f"converted.{runtime}.files.{name}")
            if problem:
                return problem
            if name != Path(name).name:
                return f"converted.{runtime}.files has a file name with a path, {name!r}"
    return None


def _declaration_problem(declaration) -> str | None:
    """What is wrong with the optional model declaration (toolkit.core.declaration), or None."""
    if declaration is None:
        return None
    try:
        Declaration.from_dict(declaration, NAME)
    except UsageError as e:
        return str(e).removeprefix(f"{NAME}: ")
    return None


def _attention_problem(att, graphs: set[str]) -> str | None:
    """The optional declaration of the attention outputs (`tk attention`, verify's attention variant)."""
    if att is None:
        return None
    if not isinstance(att, dict) or not set(att) <= graphs:
        return f"'attention' must map graph names ({', '.join(sorted(graphs))}) to lists of outputs"
    for graph, tensors in att.items():
        if not isinstance(tensors, list):
            return f"attention.{graph} must be a list"
        for t in tensors:
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"] and isinstance(t.get("dtype"), str) and t["dtype"] in DTYPES
                    and isinstance(t.get("dims"), list) and all(map(_dim_ok, t["dims"]))
                    and isinstance(t.get("fill", "normal"), str)):
                return f"attention.{graph} has a malformed output {str(t)[:60]}"
    return None


@contextlib.contextmanager
def locked(directory: str | Path) -> Iterator[None]:
    """The model directory's write lock, for a command that writes graphs and then the manifest:
    two such commands on one directory run one after the other, and the second sees the first's work."""
    with exclusive(directory, f"{directory}"):
        yield


@contextlib.contextmanager
def updating(directory: str | Path) -> Iterator[Manifest]:
    """The manifest, read under the directory's lock and saved when the block ends without an exception,
    so that two commands adding to it at once (a variant, a verify record, a metric) both keep what they added."""
    with locked(directory):
        m = load(directory)
        yield m
        m.save()


def record_metric(directory: str | Path, name: str, variant: str, result: dict) -> None:
    """Stores a measured result (`tk evaluate --record`) under `name`, or `name_VARIANT` for a variant other than fp32."""
    with updating(directory) as m:
        m.metrics[name if variant == PLAIN else f"{name}_{variant}"] = result


def write(directory: Path, data: dict) -> None:
    """Saves JSON manifest data into `directory` (through Manifest.save, the one atomic write)."""
    Manifest.from_dict(directory, migrate({k: v for k, v in data.items() if k != "format"}, Path(directory) / NAME)).save()
