"""`tk export`: checkpoint -> self-contained directory of ONNX graphs, tokenizer and manifest.json.

Exporter: torch.onnx.export with dynamo=True (torch.export + onnxscript). It is
PyTorch's supported path, and it fails at export time when a dimension declared
dynamic would be specialised, instead of silently freezing it the way a trace can.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import json
import logging
import os
import platform
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from toolkit.core import architectures, manifest, outputs, variants
from toolkit.core.data import CORPUS_SHA256
from toolkit.core.declaration import ADAPTER, HF, Declaration
from toolkit.core.errors import ToolkitError, UsageError, first_line, path_problem
from toolkit.core.graphs import GraphSpec, make_inputs
from toolkit.core.node_map import node_map_name
from toolkit.core.tokenizer import BOS, EOS, PAD, UNK
from toolkit.core.variants import ExportOptions, wanted_variants
from toolkit.graphs.variants import build
from toolkit.pytorch import adapter, bart_family, checkpoint, hf_import, registry

# Sizes of the example inputs traced at export: all distinct and >= 2, so the
# exporter can neither specialise an axis to 0/1 nor conclude two axes are equal.
EXAMPLE_SIZES = {"batch": 3, "src_len": 7, "past_len": 5, "n_q": 4, "n_kv": 6}
# The second size every graph runs at before anything is written (all differ from EXAMPLE_SIZES): an axis the graph
# froze at the traced size fails or differs from PyTorch here, and export refuses it instead of writing a directory
# whose every longer sentence fails in translate.
SECOND_SIZES = {"batch": 2, "src_len": 11, "past_len": 3, "n_q": 6, "n_kv": 9}
# Configs for --random-init: small enough that tests export every model in seconds.
SMALL = {"vocab_size": 97, "num_hiddens": 32, "ffn_num_hiddens": 64, "num_heads": 4, "num_layers": 2,
         "embed_size": 24, "max_len": 24, "dropout": 0.0}


def dynamic_shapes(spec: GraphSpec, max_len: int) -> tuple[dict, ...]:
    """torch.export Dims for every named input axis; one Dim object per name so shared axes stay tied."""
    bounds = {"src_len": (1, max_len), "past_len": (0, max_len - 1), "batch": (1, 4096)}
    dims = {name: torch.export.Dim(name, min=bounds.get(name, (1, 4096))[0], max=bounds.get(name, (1, 4096))[1])
            for name in spec.symbolic_dims() if "+" not in name}
    # One entry: the wrappers' forward(*inputs) is a single variadic parameter.
    return (tuple({i: dims[d] for i, d in enumerate(t.dims) if isinstance(d, str)} or None for t in spec.inputs),)


def name_dims(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Writes the declared dim names into the graph's inputs and outputs.

    Inputs keep a number wherever the exporter froze an axis, so `tk verify`
    sees and reports it; outputs take the declaration, because the exporter's
    own output shapes are sometimes stale (its GRU keeps the example length).
    """
    for values, tensors, is_input in ((model.graph.input, spec.inputs, True), (model.graph.output, spec.outputs, False)):
        by_name = {t.name: t for t in tensors}
        for value in values:
            declared = by_name[value.name]
            for dim, want in zip(value.type.tensor_type.shape.dim, declared.dims):
                if isinstance(want, int):
                    dim.dim_value = want
                elif not (is_input and dim.HasField("dim_value")):
                    dim.dim_param = want


def node_origins(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Node name -> [PyTorch module path, module class, source file:line], from the exporter's metadata (which
    `tk verify --localize` reports; the metadata itself, a stack trace per node, would triple the file)."""
    import ast
    import re

    out = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if "pkg.torch.onnx.name_scopes" not in meta:
            continue
        try:
            scopes = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])
            classes = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "[]"))
        except (ValueError, SyntaxError):
            continue
        # The last scope is the operation itself; the ones before it walk down the modules ('' is the graph wrapper,
        # 'model' the model). A module reached through another's attribute appears under its full name: start again there.
        path: list[str] = []
        for scope in scopes[:-1]:
            if scope.startswith("model."):
                path = scope.split(".")[1:]
            elif scope and scope != "model" and not scope.startswith("_empty"):
                path.append(scope)
        modules = [c for c in classes[:-1] if not c.startswith(("aten.", "_empty"))]
        frames = re.findall(r'File "([^"]+)", line (\d+)', meta.get("pkg.torch.onnx.stack_trace", ""))
        mine = [f"{f[f.rfind('/models/') + 1:]}:{line}" for f, line in frames if "/models/" in f]
        if path or mine:
            out[node.name] = [".".join(path), modules[-1] if modules else "", mine[-1] if mine else ""]
    return out


def _export_cause(e: BaseException) -> str:
    """What broke an export, in one line: torch.export's own first line is only "Failed to export the model with
    torch.export. This is step 1/3 ..."; the line that names the cause follows its "## Exception summary"."""
    lines = [ln.strip() for ln in str(e).splitlines()]
    if "## Exception summary" in lines:
        after = [ln for ln in lines[lines.index("## Exception summary") + 1:] if ln]
        if after:
            return after[0][:300]
    return first_line(e)


@contextlib.contextmanager
def torchlib_registry_once() -> Iterator[None]:
    """torch.onnx.export builds its registry of ONNX functions anew at every call: 0.8 s warm (1.5 s cold) of reading
    the source of torchlib's 994 functions (onnxscript parses each one's to learn its domain), a quarter of a small
    model's two-graph export. tk passes no custom translations, the one thing that changes a registry after it is
    built, so within this block each registry is built once per opset per process and handed to every export.
    Where torch moved the registry (another release), nothing is patched: each export builds its own, as before."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        yield
        return
    owner = _registration.ONNXRegistry
    built = owner.__dict__.get("from_torchlib")
    if not isinstance(built, classmethod):
        yield
        return

    def once(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = built.__func__(cls, *args, **kwargs)
        return _REGISTRIES[key]

    owner.from_torchlib = classmethod(once)
    try:
        yield
    finally:
        owner.from_torchlib = built


_REGISTRIES: dict[tuple, object] = {}  # torchlib_registry_once's registries, by opset


def export_graph(module: torch.nn.Module, spec: GraphSpec, path: Path, opset: int, max_len: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    feeds = make_inputs(spec, EXAMPLE_SIZES, rng, vocab)
    args = tuple(torch.from_numpy(feeds[n]) for n in spec.input_names)
    log = io.StringIO()
    try:
        # The exporter narrates every stage on stdout; keep it for the error message only.
        with warnings.catch_warnings(), redirect_stdout(log), redirect_stderr(log), torchlib_registry_once():
            warnings.simplefilter("ignore")
            logging.getLogger("torch").setLevel(logging.ERROR)
            program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes(spec, max_len),
                                        input_names=spec.input_names, output_names=spec.output_names,
                                        opset_version=opset, optimize=False, verbose=False)
    except Exception as e:
        raise ToolkitError(f"torch.onnx.export failed for graph '{spec.name}': {_export_cause(e)}") from e
    # Fold only small constants: folding a weight's transpose would store a second,
    # renamed copy of it, doubling the file and hiding which parameter it came from.
    import onnxscript.optimizer

    forget_traced_shapes(program.model)
    onnxscript.optimizer.optimize_ir(program.model, input_size_limit=1024, output_size_limit=1024,
                                     should_fold=lambda node: False if node.op_type == "Transpose" else None)
    model = program.model_proto
    (path.parent / node_map_name(path.name)).write_text(json.dumps(node_origins(model), separators=(",", ":")), encoding="utf-8")
    for node in model.graph.node:
        # The exporter annotates every node with a Python stack trace; they triple the file size.
        del node.metadata_props[:]
        node.doc_string = ""
    name_dims(model, spec)
    # Weights go beside the graph (share_weights then moves them into weights.bin): one protobuf message cannot hold
    # 2 GB, and an NLLB-1.3B-shaped decoder holds 3.5 GB.
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=staged_weights(path),
                    size_threshold=1024)
    onnx.checker.check_model(str(path), full_check=True)
    onnx.shape_inference.infer_shapes_path(str(path), check_type=True, strict_mode=True)


def staged_weights(path: Path) -> str:
    """The file a freshly exported graph's weights are written to, until share_weights moves them into weights.bin."""
    return f"{path.name}.data"


def forget_traced_shapes(model) -> None:
    """Drops the static shapes the exporter recorded on intermediate values, so the optimiser folds shapes only from
    what ONNX shape inference derives from the (dynamic) inputs. The exporter records some of them at the traced size
    (a reshape after a time-major nn.GRU: [7, batch, 32]); folded, that became a Reshape to 7 source positions, and the
    graph failed on every other source length."""
    keep = {id(v) for v in (*model.graph.inputs, *model.graph.outputs)}
    for node in model.graph.all_nodes():
        for value in node.outputs:
            if id(value) not in keep:
                value.shape = None


def encoder_integers(specs: dict[str, GraphSpec], name: str, feeds: dict[str, np.ndarray], sizes: dict[str, int],
                     rng: np.random.Generator, vocab: int, run_encoder) -> dict[str, np.ndarray]:
    """The feeds of graph `name` with every integer input that is an integer output of the encoder (valid lengths passed
    through, say) replaced by the encoder's own value on a source of the same batch and lengths: random integers there
    (0, -1) mask whole rows and make NaN on both sides, which compares nothing. `run_encoder(feeds) -> outputs`."""
    encoder = specs.get("encoder")
    if encoder is None or name == "encoder":
        return feeds
    produced = {t.name for t in encoder.outputs if t.dtype == "int64"}
    wanted = [t.name for t in specs[name].inputs if t.dtype == "int64" and t.name in produced]
    if not wanted:
        return feeds
    source = make_inputs(encoder, sizes, rng, vocab)
    if "src_len" in feeds:
        source["src_len"] = feeds["src_len"]
    out = run_encoder(source)
    return {**feeds, **{n: np.asarray(out[n]) for n in wanted}}


def _frozen_input(model: onnx.ModelProto, spec: GraphSpec) -> str | None:
    """The first declared-dynamic input axis the exported graph holds as a number, in words."""
    for value, declared in zip(model.graph.input, spec.inputs):
        for axis, (dim, want) in enumerate(zip(value.type.tensor_type.shape.dim, declared.dims)):
            if isinstance(want, str) and dim.HasField("dim_value"):
                return f"input {declared.name} axis {axis} ('{want}') is frozen to {dim.dim_value}"
    return None


def check_sizes(module: torch.nn.Module, spec: GraphSpec, path: Path, vocab: int, specs: dict[str, GraphSpec],
                encoder_module: torch.nn.Module | None, max_len: int) -> None:
    """Runs the exported graph with ONNX Runtime at SECOND_SIZES and compares it with PyTorch; a failure is one line
    naming the graph, the input and the axis (found by changing one axis at a time from the traced sizes)."""
    from toolkit.core.variants import CATALOGUE
    from toolkit.runtimes.onnxruntime.sessions import create_session

    model = onnx.load(path, load_external_data=False)
    frozen = _frozen_input(model, spec)
    if frozen:
        raise UsageError(f"export of graph '{spec.name}' refused: {frozen} (the exporter specialised it); "
                         "make that axis follow the input's shape in your code")
    session = create_session(path, "cpu", threads=1)
    atol, rtol = CATALOGUE["fp32"].tolerance
    run_encoder = None
    if encoder_module is not None:
        enc = specs["encoder"]
        run_encoder = lambda feeds: dict(zip(enc.output_names, (o.numpy() for o in _torch_run(encoder_module, enc, feeds))))  # noqa: E731

    def problem(sizes: dict[str, int]) -> str | None:
        rng = np.random.default_rng(1)
        feeds = encoder_integers(specs, spec.name, make_inputs(spec, sizes, rng, vocab), sizes, rng, vocab, run_encoder)
        try:
            got = session.run(None, feeds)
        except Exception as e:  # ONNX Runtime refusing a size is the finding
            return f"ONNX Runtime failed ({first_line(e, 90)})"
        want = [o.numpy() for o in _torch_run(module, spec, feeds)]
        for name, g, w in zip(spec.output_names, got, want):
            if g.shape != w.shape:
                return f"output {name} has shape {g.shape}, PyTorch's {w.shape}"
            if not np.allclose(g.astype(np.float64), w.astype(np.float64), atol=atol, rtol=rtol, equal_nan=False):
                return f"output {name} differs from PyTorch's (largest difference {float(np.nanmax(np.abs(g - w.astype(g.dtype)))):.2g})"
        return None

    second = dict(SECOND_SIZES)
    if max_len < second["src_len"]:  # within the model's positions, and still not the traced length
        second["src_len"] = max_len if max_len != EXAMPLE_SIZES["src_len"] else max_len - 1
    found = problem({**EXAMPLE_SIZES, **second})
    if found is None:
        return
    axes = [d for d in sorted(spec.symbolic_dims()) if "+" not in d and d in SECOND_SIZES]
    for dim in axes:  # one axis at a time: the one that fails alone is the frozen one
        alone = problem({**EXAMPLE_SIZES, dim: second[dim]})
        if alone is not None:
            inp, axis = next((t.name, t.dims.index(dim)) for t in spec.inputs if dim in t.dims)
            raise UsageError(f"export of graph '{spec.name}' refused: input {inp} axis {axis} ('{dim}') is frozen to "
                             f"{EXAMPLE_SIZES[dim]}: at {dim}={second[dim]} {alone}")
    raise UsageError(f"export of graph '{spec.name}' refused: at " + ", ".join(f"{d}={second[d]}" for d in axes)
                     + f" {found}, though each axis alone passes")


def _torch_run(module: torch.nn.Module, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> tuple:
    with torch.no_grad():
        return tuple(module(*(torch.from_numpy(feeds[n]) for n in spec.input_names)))


def load_model(opts: ExportOptions):
    """(entry, config, model, checkpoint-or-None) from a checkpoint or a random init."""
    if opts.random_init:
        if not opts.model:
            raise UsageError("--random-init needs a model name, e.g. tk export transformer --random-init --out DIR")
        entry = registry.get(opts.model)
        if not entry.random_init:
            raise UsageError(f"--random-init: a {opts.model} model comes from your code; export it with tk export MODULE:FUNCTION")
        torch.manual_seed(opts.seed)
        cfg = entry.config(**SMALL)
        return entry, cfg, entry.build(cfg).eval(), None
    if str(opts.checkpoint).startswith(hf_import.PREFIX):
        source = hf_import.read(opts.checkpoint)
        return registry.get(source.architecture), source.settings, source.model, {HF: source}
    if adapter.is_target(str(opts.checkpoint)):
        own, settings = adapter.load(str(opts.checkpoint))
        return adapter.MODEL, settings, own.model, {ADAPTER: own}
    ckpt = checkpoint.load(opts.checkpoint)
    entry, cfg, model = checkpoint.build_model(ckpt)
    return entry, cfg, model, ckpt


def tk_entries(out: Path) -> set[str] | None:
    """The entries of a model directory that tk wrote: manifest.json and every file its manifest lists (read as plain
    JSON, so a manifest this tk no longer accepts is still replaced); None: no tk manifest there."""
    try:
        data = json.loads((out / manifest.NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply to parse
        return None
    if not (isinstance(data, dict) and data.get("format") == manifest.FORMAT):
        return None
    names = {manifest.NAME}
    stack = [data]
    while stack:
        item = stack.pop()
        values = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if isinstance(item, dict) and isinstance(item.get("file"), str) and item["file"]:
            names.add(Path(item["file"]).parts[0])
        stack.extend(v for v in values if isinstance(v, (dict, list)))
    return names


def sources(opts: ExportOptions) -> list[str]:
    """The files and directories an export reads: a checkpoint, or an `hf:` directory (MODULE:FUNCTION imports code)."""
    if opts.random_init or not opts.checkpoint or adapter.is_target(str(opts.checkpoint)):
        return []
    source = str(opts.checkpoint)
    return [source[len(hf_import.PREFIX):] if source.startswith(hf_import.PREFIX) else source]


def prepare_output(opts: ExportOptions) -> outputs.Output:
    """--out, checked before any work: --force replaces only a directory tk exported, holding nothing else."""
    return outputs.prepare(opts.out, option="--out", sources=sources(opts), force=opts.force, owned=tk_entries,
                          what="an exported tk model directory (no tk manifest.json)", keep_foreign=False)


def portable_path(path: str | Path) -> str:
    """Where a checkpoint lay, as a manifest that travels may say it: relative to the directory export ran in
    (verify finds it there on the machine that trained it), else its name alone; never another machine's path."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def export(opts: ExportOptions, echo=print) -> Path:
    """Writes the model directory; on any failure nothing is left at opts.out."""
    if problem := path_problem(Path(opts.out).absolute(), "--out"):  # before any work: ONNX fails on it only at the end
        raise UsageError(problem)
    target = prepare_output(opts)
    if opts.opset < 18:
        raise UsageError(f"--opset {opts.opset} is too old; the dynamo exporter needs opset 18 or newer")
    entry, cfg, model, ckpt = load_model(opts)
    architectures.get(entry.name).check("export")
    for variant in wanted_variants(opts):  # before minutes of export: a variant this architecture must not run
        architectures.check_variant(entry.name, variant)
    if opts.languages and ckpt is not None and HF in ckpt:  # a pair the import cannot state: refused before minutes of export
        from toolkit.core.tokenizers import declaration_stating

        source = ckpt[HF]
        declaration = Declaration(source.rules, source.tokenizer, origin=HF, placeholders=False).to_dict()
        declaration_stating(declaration, *opts.languages, where=str(source.directory))
    with outputs.writing(target) as tmp:
        data = write_directory(tmp, opts, entry, cfg, model, ckpt, echo)
        manifest.write(tmp, data)
    return opts.out


def export_model(source: str, out: str | Path, force: bool = False, fp16: bool = False, optimize: bool = False,
                 quantize: str | None = None, echo=lambda message: None) -> Path:
    """The Python API of `tk export SOURCE --out OUT`: SOURCE is a checkpoint, `hf:DIR` (a Hugging Face MarianMTModel
    directory) or `MODULE:FUNCTION` (your own model: FUNCTION() returns a toolkit.Seq2SeqAdapter). Returns OUT."""
    opts = ExportOptions(out=Path(out), checkpoint=str(source), force=force, fp16=fp16, optimize=optimize, quantize=quantize,
                         command=f"export_model({str(source)!r}, {str(out)!r})")
    return export(opts, echo)


def attention_declaration(model: str, config: dict) -> dict:
    """The manifest entry of the attention variant (built in memory from the fp32 graphs when used)."""
    entry = registry.get(model)
    if entry.attention is None:
        return {}
    extra = entry.attention(entry.config(**config))
    return {"attention": {g: [dataclasses.asdict(t) for t in ts] for g, ts in extra.items()}}


def export_graphs(tmp: Path, opts: ExportOptions, entry, cfg, model, echo) -> dict:
    """Each graph exported into `tmp` and run at a second size against PyTorch (check_sizes); their manifest records."""
    max_len = getattr(cfg, "max_len", 64)
    vocab = registry.token_bound(cfg)
    graphs = {}
    specs = {spec.name: spec for spec in entry.graphs(cfg)}
    encoder_module = registry.graph_module(entry, model, specs["encoder"]) if "encoder" in specs else None
    for spec in specs.values():
        path = tmp / f"{spec.name}.onnx"
        echo(f"exporting {spec.name} ...")
        module = registry.graph_module(entry, model, spec)
        export_graph(module, spec, path, opts.opset, max_len, vocab)
        check_sizes(module, spec, path, vocab, specs, encoder_module, max_len)
        graphs[spec.name] = {"file": path.name, "sha256": manifest.file_sha256(path), "spec": spec.to_dict(),
                             "bytes": path.stat().st_size}
    return graphs


def write_directory(tmp: Path, opts: ExportOptions, entry, cfg, model, ckpt, echo) -> dict:
    graphs = export_graphs(tmp, opts, entry, cfg, model, echo)
    node_maps = [{"file": node_map_name(f"{name}.onnx"), "sha256": manifest.file_sha256(tmp / node_map_name(f"{name}.onnx"))}
                 for name in graphs]
    share_weights(tmp, graphs)
    made = {}
    for variant in wanted_variants(opts):
        echo(f"writing the {variant} variant ...")
        made[variant] = {"graphs": {}, **variants.CATALOGUE[variant].record()}
        for name, g in graphs.items():
            dst = tmp / f"{name}{variants.CATALOGUE[variant].suffix}.onnx"
            build(tmp / g["file"], dst, variant)
            made[variant]["graphs"][name] = {"file": dst.name, "sha256": manifest.file_sha256(dst), "bytes": dst.stat().st_size}
    data = {
        "model": entry.name, "kind": entry.kind, "config": dataclasses.asdict(cfg), "graphs": graphs,
        "variants": made, "opset": opts.opset, "versions": versions(),
        "tokenizer": None, "special_tokens": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
        "export_command": opts.command, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **attention_declaration(entry.name, dataclasses.asdict(cfg)),
        "extra_files": node_maps,
    }
    if entry.kind == architectures.SEQ2SEQ:  # tk's own rules, declared like any other model's (an import's replace them below)
        data["declaration"] = Declaration().to_dict()
    if ckpt is not None and ADAPTER in ckpt:
        data.update(adapter.write_files(ckpt[ADAPTER], cfg, tmp))
        data["extra_files"] = node_maps + data["extra_files"]  # a target word list, hashed as every file is
        data["checkpoint"] = {"path": cfg.target, "weights_sha256": checkpoint.weights_sha256(model)}
    elif ckpt is not None and HF in ckpt:
        data.update(bart_family.write_files(ckpt[HF], tmp))
        data["extra_files"] = node_maps + data["extra_files"]
        data["checkpoint"] = ckpt[HF].record(checkpoint.weights_sha256(model))
        data["checkpoint"]["path"] = portable_path(ckpt[HF].directory)
    elif ckpt is None:
        # Rebuilt by verify from the seed; the weights digest proves it got the same model.
        data["checkpoint"] = {"random_init": True, "seed": opts.seed, "weights_sha256": checkpoint.weights_sha256(model)}
    else:
        data["checkpoint"] = {"path": portable_path(ckpt["path"]), "sha256": checkpoint.sha256(ckpt["path"]),
                              "weights_sha256": checkpoint.weights_sha256(model),
                              # The digest the checkpoint carried and load checked (None: an older checkpoint without one).
                              "checkpoint_weights_sha256": ckpt.get("weights_sha256")}
        data["training"] = {**ckpt.get("train", {}), "history": ckpt.get("progress", {}).get("history", []),
                            "data": {k: v for k, v in ckpt.get("data", {}).items() if k not in ("x_train", "y_train")}}
        data["metrics"] = ckpt.get("metrics", {})
        if ckpt.get("tokenizer"):
            (tmp / "tokenizer.model").write_bytes(ckpt["tokenizer"])
            data["tokenizer"] = {"file": "tokenizer.model", "sha256": manifest.file_sha256(tmp / "tokenizer.model"),
                                 "type": "sentencepiece unigram, shared English/French"}
        if ckpt.get("data", {}).get("sha256") == CORPUS_SHA256:
            # CC BY 2.0 FR asks for attribution wherever a model trained on the data is shipped.
            (tmp / "LICENSE-DATA.md").write_text(DATA_LICENSE, encoding="utf-8")
            data.setdefault("extra_files", []).append({"file": "LICENSE-DATA.md", "sha256": manifest.file_sha256(tmp / "LICENSE-DATA.md")})
        if "x_train" in ckpt.get("data", {}):
            # The kernel regression's keys and values are its training points.
            np.savez(tmp / "train_points.npz", x=np.array(ckpt["data"]["x_train"], np.float32),
                     y=np.array(ckpt["data"]["y_train"], np.float32))
            data.setdefault("extra_files", []).append({"file": "train_points.npz", "sha256": manifest.file_sha256(tmp / "train_points.npz")})
    return data


WEIGHTS = "weights.bin"

DATA_LICENSE = """# Training data

This model was trained on the Tatoeba English-French sentence pairs as packaged by
manythings.org/anki (fra-eng.zip, fra.txt sha256 0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104).

License of the data: Creative Commons Attribution 2.0 France (CC BY 2.0 FR),
https://creativecommons.org/licenses/by/2.0/fr/

Attribution: www.manythings.org/anki and tatoeba.org.
"""


def share_weights(tmp: Path, graphs: dict) -> None:
    """Moves every large initializer into one weights.bin that all graphs point into.

    The encoder and decoder hold the same embedding (and, in the decoder, the
    tied output projection); stored once, a model directory is about a fifth smaller.
    """
    offsets: dict[tuple[str, bytes], tuple[int, int]] = {}
    with open(tmp / WEIGHTS, "wb") as blob:
        for g in graphs.values():
            path = tmp / g["file"]
            model = onnx.load(path)
            for init in model.graph.initializer:
                raw = onnx.numpy_helper.to_array(init).tobytes()
                if len(raw) < 1024:
                    continue
                key = (init.name, hashlib.sha256(raw).digest())
                if key not in offsets:
                    blob.seek(0, os.SEEK_END)
                    start = blob.tell() + (-blob.tell() % 64)  # aligned, so the runtime can map it directly
                    blob.seek(start)
                    blob.write(raw)
                    offsets[key] = (start, len(raw))
                start, length = offsets[key]
                init.ClearField("raw_data")
                for field in ("float_data", "int64_data", "int32_data", "double_data"):
                    init.ClearField(field)
                init.data_location = onnx.TensorProto.EXTERNAL
                del init.external_data[:]
                for k, v in (("location", WEIGHTS), ("offset", str(start)), ("length", str(length))):
                    init.external_data.add(key=k, value=v)
            onnx.save_model(model, path)
            (tmp / staged_weights(path)).unlink(missing_ok=True)
            g["sha256"], g["bytes"] = manifest.file_sha256(path), path.stat().st_size
    if not offsets:  # nothing large enough to share (the kernel regression has one scalar)
        (tmp / WEIGHTS).unlink()
        return
    for g in graphs.values():
        onnx.checker.check_model(str(tmp / g["file"]), full_check=True)
    graphs_extra = {"file": WEIGHTS, "sha256": manifest.file_sha256(tmp / WEIGHTS)}
    for g in graphs.values():
        g["weights"] = graphs_extra


def versions() -> dict:
    import onnxruntime
    import onnxscript

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "onnxscript": onnxscript.__version__, "python": platform.python_version(), "numpy": np.__version__}
