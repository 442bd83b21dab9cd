"""manifest.json: an exported model directory describes itself. Torch-free: translate reads it."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.graphs import GraphSpec
from toolkit.variants import BUILT, PLAIN

FORMAT = "tk-export/1"
NAME = "manifest.json"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Manifest:
    directory: Path
    data: dict

    @property
    def model(self) -> str:
        return self.data["model"]

    @property
    def kind(self) -> str:
        return self.data["kind"]

    @property
    def config(self) -> dict:
        return self.data["config"]

    @property
    def max_len(self) -> int:
        return int(self.config.get("max_len", 64))

    def specs(self) -> dict[str, GraphSpec]:
        return {name: GraphSpec.from_dict(g["spec"]) for name, g in self.data["graphs"].items()}

    def variants(self) -> list[str]:
        return [PLAIN, *self.data.get("variants", {})]

    def variants_for(self, provider: str) -> list[str]:
        """fp32 and the variants exported for this provider (fp16 for cuda; optimized and int8 for cpu)."""
        return [PLAIN, *(v for v, d in self.data.get("variants", {}).items() if d.get("provider") == provider)]

    def graph_path(self, graph: str, variant: str = PLAIN) -> Path:
        if variant != PLAIN and variant not in self.data.get("variants", {}):
            have = ", ".join(self.variants())
            raise UsageError(f"{self.directory} has no {variant} variant (has: {have}); re-export with the matching option")
        entry = self.data["graphs"][graph] if variant == PLAIN else self.data["variants"][variant]["graphs"][graph]
        return self.directory / entry["file"]

    def tokenizer_path(self) -> Path | None:
        tok = self.data.get("tokenizer")
        return self.directory / tok["file"] if tok else None

    def check_files(self) -> None:
        """Every file the manifest lists exists and has the recorded sha256."""
        for rel, digest in self.files().items():
            path = self.directory / rel
            if not path.is_file():
                raise UsageError(f"{path} is listed in {NAME} but missing; re-export the model directory")
            if file_sha256(path) != digest:
                raise UsageError(f"{path} does not match the sha256 in {NAME} (modified or corrupt); re-export it")

    def files(self) -> dict[str, str]:
        out = {g["file"]: g["sha256"] for g in self.data["graphs"].values()}
        out.update({g["weights"]["file"]: g["weights"]["sha256"] for g in self.data["graphs"].values() if "weights" in g})
        for v in self.data.get("variants", {}).values():
            out.update({g["file"]: g["sha256"] for g in v["graphs"].values()})
        for extra in self.data.get("extra_files", []):
            out[extra["file"]] = extra["sha256"]
        if self.data.get("tokenizer"):
            out[self.data["tokenizer"]["file"]] = self.data["tokenizer"]["sha256"]
        return out


def load(directory: str | Path) -> Manifest:
    directory = Path(directory)
    path = directory / NAME
    if not directory.is_dir():
        raise UsageError(f"model directory {directory} does not exist; export one with `tk export`")
    if not path.is_file():
        raise UsageError(f"{directory} has no {NAME}; it is not an exported tk model (run `tk export` to make one)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e}); re-export the model directory") from None
    except OSError as e:
        raise UsageError(f"cannot read {path} ({e.strerror}); re-export the model directory") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an object; re-export the model directory")
    if data.get("format") != FORMAT:
        raise UsageError(f"{path} has format {data.get('format')!r}, expected {FORMAT!r}; re-export with this tk")
    problem = schema_problem(data)
    if problem:
        raise UsageError(f"{path} is not a valid tk manifest: {problem}; re-export the model directory")
    return Manifest(directory, data)


# The models a manifest may name: kind, graph names, and the cache each decoder carries from step to step.
# Torch-free on purpose (translate reads manifests); tests check it against the registry.
MODELS = {
    "transformer": ("seq2seq", lambda c: {f"self_{kv}_{i}" for i in range(c["num_layers"]) for kv in "kv"}),
    "seq2seq": ("seq2seq", lambda c: {"state"}),
    **{name: ("module", None) for name in ("masked_softmax", "dot_attention", "additive_attention", "multihead_attention", "nw")},
}
GRAPHS = {"seq2seq": {"encoder", "decoder"}, "module": {"model"}}
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


def _spec_problem(spec, where: str) -> str | None:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return f"{where} is not a graph declaration"
    for side in ("inputs", "outputs"):
        tensors = spec.get(side)
        if not isinstance(tensors, list) or not tensors:
            return f"{where}.{side} must be a non-empty list"
        for t in tensors:
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and t.get("dtype") in DTYPES
                    and isinstance(t.get("dims"), list) and all(isinstance(d, (str, int)) and not isinstance(d, bool) for d in t["dims"])
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
    if data["model"] not in MODELS:
        return f"unknown model type '{data['model']}' (known: {', '.join(MODELS)})"
    kind, cache = MODELS[data["model"]]
    if data["kind"] != kind:
        return f"model '{data['model']}' is a {kind} model, but kind says '{data['kind']}'"
    if set(data["graphs"]) != GRAPHS[kind]:
        return f"a {kind} model has graphs {sorted(GRAPHS[kind])}, this one lists {sorted(data['graphs'])}"
    max_len = data["config"].get("max_len", 64)
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        return f"config.max_len must be a positive integer, got {max_len!r}"
    for name, g in data["graphs"].items():
        problem = _file_problem(g, f"graphs.{name}") or _spec_problem(g.get("spec"), f"graphs.{name}.spec")
        if not problem and "weights" in g:
            problem = _file_problem(g["weights"], f"graphs.{name}.weights")
        if problem:
            return problem
    if cache is not None:
        layers = data["config"].get("num_layers", 0)
        if data["model"] == "transformer" and (not isinstance(layers, int) or isinstance(layers, bool) or layers < 1):
            return f"config.num_layers must be a positive integer, got {layers!r}"
        got = set(data["graphs"]["decoder"]["spec"].get("updates", {}).values())
        if got != cache(data["config"]):
            return f"its graphs carry the cache {sorted(got)}, which is not a '{data['model']}' model's {sorted(cache(data['config']))}"
    variants = data.get("variants", {})
    if not isinstance(variants, dict):
        return "'variants' must be an object"
    for v, d in variants.items():
        if v not in BUILT or not isinstance(d, dict) or not isinstance(d.get("graphs"), dict):
            return f"variants.{v} is not a known variant with graphs"
        if set(d["graphs"]) != set(data["graphs"]):
            return f"variants.{v} lists graphs {sorted(d['graphs'])}, not {sorted(data['graphs'])}"
        for name, g in d["graphs"].items():
            problem = _file_problem(g, f"variants.{v}.graphs.{name}")
            if problem:
                return problem
    if data.get("tokenizer") is not None:
        problem = _file_problem(data["tokenizer"], "tokenizer")
        if problem:
            return problem
    extra = data.get("extra_files", [])
    if not isinstance(extra, list):
        return "'extra_files' must be a list"
    for i, e in enumerate(extra):
        problem = _file_problem(e, f"extra_files[{i}]")
        if problem:
            return problem
    problem = _attention_problem(data.get("attention"), set(data["graphs"]))
    if problem:
        return problem
    for key in ("checkpoint", "training", "metrics", "versions", "verify"):
        if key in data and data[key] is not None and not isinstance(data[key], dict):
            return f"'{key}' must be an object"
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
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"] and t.get("dtype") in DTYPES
                    and isinstance(t.get("dims"), list) and all(isinstance(d, (str, int)) and not isinstance(d, bool) for d in t["dims"])
                    and isinstance(t.get("fill", "normal"), str)):
                return f"attention.{graph} has a malformed output {str(t)[:60]}"
    return None


def write(directory: Path, data: dict) -> None:
    """Atomically: a crash mid-write (or a full disk) leaves the previous manifest intact."""
    tmp = directory / f".{NAME}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, **data}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, directory / NAME)
