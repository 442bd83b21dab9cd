"""The PyTorch reference for an exported directory: the model verify and bench compare against."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from toolkit.core import architectures
from toolkit.core.declaration import ADAPTER
from toolkit.core.errors import UsageError, first_line
from toolkit.core.manifest import CheckpointRecord, Manifest
from toolkit.pytorch import checkpoint, registry

PREFIX = "model."  # the graph wrappers hold the model as `.model`, so initializers are named model.<parameter>


# What a reference read back from the graphs can prove, said wherever verify reports its reference.
GRAPHS_ONLY = "the graphs' own weights: parity of the computation only, not of the weights"


def reference_kind(source: str) -> tuple[str, str]:
    """(kind, what a pass against this reference proves) for a source string from load_reference."""
    if source.startswith("checkpoint"):
        return "checkpoint", "the graphs compute what the checkpoint's model computes, with the checkpoint's weights"
    if source.startswith("random init"):
        return "random_init", "the graphs compute what the model rebuilt from its seed computes, with those weights"
    return "graphs", GRAPHS_ONLY


def describe_checkpoint(path: str | Path, sha256: str) -> str:
    """What a checkpoint was, not where it lay (reports and manifests travel to other machines)."""
    return f"{Path(path).name} (sha256 {sha256[:12]})"


def load_reference(m: Manifest, echo=lambda s: None, checkpoint_path: str | Path | None = None):
    """(registry entry, config, model in eval mode, where the weights came from).

    In order: a random init rebuilt from its seed, the checkpoint recorded at
    export if it is here with the same sha256, or else (a shipped model, or a
    checkpoint that training has moved on since) the weights read back from the
    fp32 graphs. The weights must match the digest recorded at export in every
    case, so a graph whose weights were altered after export still fails.
    """
    entry = registry.get(m.model)
    cfg = entry.checked_config(m.config, str(m.directory / "manifest.json"))
    record = m.checkpoint or CheckpointRecord(weights_sha256="")
    if not 0 <= (record.seed or 0) < 2**32:
        raise UsageError(f"{m.directory}/manifest.json: checkpoint.seed must be an integer in [0, 2^32); re-export")
    if architectures.imported(m.model):
        return _hf_reference(m, entry, cfg, record, echo, checkpoint_path)
    if architectures.get(m.model).origin == ADAPTER:
        return _adapter_reference(m, entry, cfg, record, echo, checkpoint_path)
    if checkpoint_path is not None:
        # Given explicitly: its own digest is checked at load, and verify compares it with the graphs' weights.
        ckpt = checkpoint.load(checkpoint_path, warn=echo)
        if ckpt["model"] != m.model:
            raise UsageError(f"--checkpoint {checkpoint_path} holds a '{ckpt['model']}' model, but {m.directory} is a '{m.model}' model")
        _, cfg, model = checkpoint.build_model(ckpt)
        source = f"checkpoint {describe_checkpoint(ckpt['path'], checkpoint.sha256(ckpt['path']))} (given with --checkpoint)"
        echo(f"reference: {source}")
        return entry, cfg, model.eval(), source
    if record.random_init:
        torch.manual_seed(record.seed or 0)
        model, source = entry.build(cfg), f"random init, seed {record.seed or 0}"
    elif record.path and Path(record.path).is_file() and checkpoint.sha256(record.path) == record.sha256:
        _, cfg, model = checkpoint.build_model(checkpoint.load(record.path))
        source = f"checkpoint {describe_checkpoint(record.path, record.sha256)}"
    else:
        # A shipped model's checkpoint is not on this machine, or training has moved it on since export.
        why = "changed since export" if record.path and Path(record.path).is_file() else "not on this machine"
        model, source = weights_from_graphs(m, entry, cfg), f"weights read from the fp32 graphs (checkpoint {why}): {GRAPHS_ONLY}"
    model.eval()
    digest = checkpoint.weights_sha256(model)
    if record.weights_sha256 and digest != record.weights_sha256:
        raise UsageError(f"reference weights ({source}) differ from the ones exported (weights digest mismatch); re-export")
    echo(f"reference: {source}")
    return entry, cfg, model, source


def _hf_reference(m: Manifest, entry, cfg, record: CheckpointRecord, echo, given: str | Path | None):
    """An imported model's reference: transformers' own model (MarianMTModel, M2M100ForConditionalGeneration) from the
    Hugging Face directory (--checkpoint hf:DIR, or the one recorded at export if it is here, unchanged), else rebuilt
    from the graphs' own weights."""
    from toolkit.pytorch import hf_import

    where = str(given) if given is not None else record.path
    here = where is not None and Path(str(where).removeprefix(hf_import.PREFIX)).is_dir()
    if given is not None and not here:
        raise UsageError(f"--checkpoint {given} is not a directory; give the Hugging Face directory the model was exported from (hf:DIR)")
    model = source = None
    if record.random_init and given is None:  # `tk export marian --random-init`: rebuilt from its seed
        torch.manual_seed(record.seed or 0)
        model, source = entry.build(cfg).eval(), f"random init, seed {record.seed or 0}"
        if checkpoint.weights_sha256(model) != record.weights_sha256:
            raise UsageError(f"reference weights ({source}) differ from the ones exported (weights digest mismatch); re-export")
    elif here:
        if hf_import.architecture_of(where).name != m.model:
            raise UsageError(f"{where} holds a {hf_import.architecture_of(where).hf_class}, but {m.directory} was exported from a "
                             f"{architectures.get(m.model).hf_class}; give the Hugging Face directory it was exported from")
        hf = hf_import.read(where)
        differ = next((k for k, v in dataclasses.asdict(hf.settings).items() if m.config.get(k) != v), None)
        if differ is not None and differ in getattr(hf.settings, "LINE_DEPENDENT", ()):
            import transformers

            raise UsageError(f"transformers {transformers.__version__} builds {where} with {differ} {getattr(hf.settings, differ)!r}, "
                             f"but {m.directory} was exported under a transformers line that builds it with "
                             f"{m.config.get(differ)!r} (4.x and 5.x read this config.json apart); re-export it under this "
                             "transformers, or verify under the line it was exported with")
        if differ is not None:
            raise UsageError(f"{where} is another model than {m.directory} ({differ} {getattr(hf.settings, differ)!r}, exported "
                             f"{m.config.get(differ)!r}); give the Hugging Face directory the model was exported from")
        model, source = hf.model.eval(), f"checkpoint Hugging Face directory {hf.directory.name}"
        if checkpoint.weights_sha256(model) != record.weights_sha256:
            if given is None:  # the recorded directory has moved on since export: not the reference any more
                model, why = None, f"{hf.directory.name} changed since export"
            else:
                echo(f"warning: the weights in {given} differ from the ones exported; the report compares the graphs with them")
    else:
        why = "the Hugging Face directory is not here"
    if model is None:
        try:
            model, source = weights_from_graphs(m, entry, cfg).eval(), f"weights read from the fp32 graphs ({why}): {GRAPHS_ONLY}"
        except UsageError as e:  # a parameter the exporter folded away (a bias of zeros, say)
            raise UsageError(f"{e.args[0].split(';')[0]}, so the graphs alone cannot rebuild the reference ({why}); "
                             "give the Hugging Face directory it was exported from: --checkpoint hf:DIR") from None
    echo(f"reference: {source.removeprefix('checkpoint ')}")
    return entry, cfg, model, source


def _adapter_reference(m: Manifest, entry, cfg, record: CheckpointRecord, echo, given: str | Path | None):
    """Your own model's reference: what MODULE:FUNCTION builds, given again by the user (a manifest never makes tk
    import code); its graphs and weights must be the ones exported."""
    from toolkit.pytorch import adapter

    if given is None:
        entry.build(cfg)  # refuses, saying which --checkpoint to give
    own, settings = adapter.load(str(given))
    if settings.graphs != cfg.graphs:
        raise UsageError(f"{given} declares other graphs than {m.directory} was exported with; give the function it was exported from")
    digest = checkpoint.weights_sha256(own.model)
    if record.weights_sha256 and digest != record.weights_sha256:
        raise UsageError(f"the weights {given} builds differ from the ones exported to {m.directory} (weights digest mismatch); re-export")
    echo(f"reference: {given}")
    return entry, cfg, own.model, f"checkpoint {given}"


def graph_parameters(directory: Path, files: list[str]) -> dict[str, torch.Tensor]:
    """Model parameters stored in the given graphs: named initializers, plus the GRU biases
    that the exporter folds into each ONNX GRU node's unnamed bias input.

    A weight stored in the directory's weights file is mapped from it, not read into memory (copy-on-write: a
    change stays in this process): an NLLB-1.3B-shaped model's 5.5 GB are read as they are used, and a verify that
    held them twice beside its sessions and the reference ran out of 24 GB."""
    found = {}
    for file in files:
        graph = onnx.load(directory / file, load_external_data=False).graph
        for init in graph.initializer:
            if init.name.startswith(PREFIX):
                found[init.name[len(PREFIX):]] = torch.from_numpy(initializer_array(directory, init))
        found.update(_gru_biases(graph, directory))
    return found


def initializer_array(directory: Path, init: onnx.TensorProto) -> np.ndarray:
    """An initializer's values: mapped from its external data file (which must lie in `directory`: a graph is a file
    from outside), or read from the graph itself."""
    if init.data_location != onnx.TensorProto.EXTERNAL:
        return onnx.numpy_helper.to_array(init).copy()
    info = {e.key: e.value for e in init.external_data}
    location = Path(info.get("location", ""))
    path = (directory / location).resolve()
    if location.is_absolute() or not path.is_relative_to(Path(directory).resolve()) or not path.is_file():
        raise UsageError(f"{directory}: tensor {init.name!r} points to external data {str(location)!r}, which is not a "
                         "file of the model directory; re-export it")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
    shape = tuple(init.dims)
    offset = int(info.get("offset", 0))
    if offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > path.stat().st_size:
        raise UsageError(f"{directory}: tensor {init.name!r} reaches past the end of {location}; re-export it")
    if not shape or 0 in shape:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="c", offset=offset, shape=shape)


def _gru_biases(graph: onnx.GraphProto, directory: Path) -> dict[str, torch.Tensor]:
    """bias_ih/bias_hh of each exported nn.GRU layer, read back from its ONNX GRU node.

    ONNX stores B = [Wb_z, Wb_r, Wb_h, Rb_z, Rb_r, Rb_h]; PyTorch orders the gates r, z, n.
    The layer's name comes from the named weight its W input is computed from.
    """
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}

    def constant(name: str) -> np.ndarray | None:
        # The exporter may hand B to the GRU through shape-only nodes (an Unsqueeze of a folded constant).
        while name not in inits:
            node = producer.get(name)
            if node is None or node.op_type not in ("Unsqueeze", "Reshape", "Identity", "Squeeze"):
                return None
            name = node.input[0]
        return initializer_array(directory, inits[name])

    def parameters_behind(name: str, seen: set) -> set[str]:
        if name in seen:
            return set()
        seen.add(name)
        if name in inits:
            return {name[len(PREFIX):]} if name.startswith(PREFIX) else set()
        node = producer.get(name)
        return set().union(*(parameters_behind(i, seen) for i in node.input if i)) if node else set()

    out = {}
    for node in graph.node:
        b = constant(node.input[3]) if node.op_type == "GRU" and len(node.input) >= 4 and node.input[3] else None
        if b is None:
            continue
        weights = parameters_behind(node.input[1], set())
        if len(weights) != 1 or "weight_ih" not in next(iter(weights)):
            continue
        name = next(iter(weights))
        b = b.reshape(-1)
        h = b.size // 6
        for half, kind in ((b[: 3 * h], "bias_ih"), (b[3 * h:], "bias_hh")):
            z, r, n = half[:h], half[h: 2 * h], half[2 * h:]
            out[name.replace("weight_ih", kind)] = torch.from_numpy(np.concatenate([r, z, n]).copy())
    return out


def resolve_parameters(model: torch.nn.Module, found: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A full state dict from the parameters found, and the names that could not be found.

    Tied parameters appear under several names in the state dict but once in a graph;
    non-persistent buffers (the positional-encoding table) are rebuilt by the model.
    """
    state = model.state_dict(keep_vars=True)
    out = {k: v for k, v in found.items() if k in state}
    missing = []
    for alias in state:
        if alias not in out:
            twin = next((k for k in out if state[k] is state[alias]), None)
            if twin is None:
                missing.append(alias)
            else:
                out[alias] = out[twin]
    return out, missing


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of a model that also holds tensors its forward stored (d2l's attention decoder keeps
    `self._attention_weights`, the attention its `attention_weights`): such a tensor computed with gradients on is not
    a graph leaf, and copy.deepcopy refuses it ("Only Tensors created explicitly by the user support the deepcopy
    protocol"). They are plots' data, not weights: the copy holds them detached."""
    import copy

    memo: dict[int, object] = {}
    for module in model.modules():
        for value in module.__dict__.values():
            for tensor in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(tensor, torch.Tensor) and not isinstance(tensor, torch.nn.Parameter) and tensor.grad_fn is not None:
                    memo[id(tensor)] = tensor.detach().clone()
    return copy.deepcopy(model, memo)


def weights_from_graphs(m: Manifest, entry, cfg, like: torch.nn.Module | None = None) -> torch.nn.Module:
    """The model rebuilt from the parameters its exported graphs hold: into the registry's build of its config, or into
    a copy of `like` (a model of the same architecture, such as an adapter's, which the registry never builds)."""
    model = entry.build(cfg) if like is None else copy_model(like)
    found = graph_parameters(m.directory, [g.file for g in m.graphs.values()])
    state, missing = resolve_parameters(model, found)
    if missing:
        raise UsageError(f"parameter {missing[0]} is in no graph of {m.directory}; verify needs the training checkpoint")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # shapes that differ: the graphs' weights are not of the model the config describes
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), first_line(e))
        raise UsageError(f"the weights in the graphs of {m.directory} do not fit the model its manifest.json's config "
                         f"describes ({detail[:200]}); re-export the model directory") from None
    return model
