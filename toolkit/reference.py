"""The PyTorch reference for an exported directory: the model verify and bench compare against."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx.numpy_helper
import torch

from toolkit import checkpoint, registry
from toolkit.errors import UsageError
from toolkit.manifest import Manifest

PREFIX = "model."  # the graph wrappers hold the model as `.model`, so initializers are named model.<parameter>


def load_reference(m: Manifest, echo=lambda s: None):
    """(registry entry, config, model in eval mode, where the weights came from).

    In order: the checkpoint recorded at export (its sha256 must match), a
    random init rebuilt from its seed, or, when the checkpoint is not on this
    machine (a shipped model), the weights read back from the fp32 graphs. The
    rebuilt weights must match the digest recorded at export in every case.
    """
    entry = registry.get(m.model)
    cfg = entry.config(**m.config)
    record = m.data.get("checkpoint") or {}
    if record.get("random_init"):
        torch.manual_seed(record["seed"])
        model, source = entry.build(cfg), f"random init, seed {record['seed']}"
    elif record.get("path") and Path(record["path"]).is_file():
        if checkpoint.sha256(record["path"]) != record["sha256"]:
            raise UsageError(f"checkpoint {record['path']} has changed since export (sha256 differs); re-export it")
        _, cfg, model = checkpoint.build_model(checkpoint.load(record["path"]))
        source = f"checkpoint {record['path']}"
    else:
        model, source = weights_from_graphs(m, entry, cfg), "weights read from the fp32 graphs (checkpoint not on this machine)"
    model.eval()
    digest = checkpoint.weights_sha256(model)
    if record.get("weights_sha256") and digest != record["weights_sha256"]:
        raise UsageError(f"reference weights ({source}) differ from the ones exported (weights digest mismatch); re-export")
    echo(f"reference: {source}")
    return entry, cfg, model, source


def weights_from_graphs(m: Manifest, entry, cfg) -> torch.nn.Module:
    model = entry.build(cfg)
    found = {}
    for name in m.data["graphs"]:
        graph = onnx.load(m.graph_path(name), load_external_data=True)
        for init in graph.graph.initializer:
            if init.name.startswith(PREFIX):
                found[init.name[len(PREFIX):]] = torch.from_numpy(onnx.numpy_helper.to_array(init).copy())
    state = model.state_dict()
    # Tied parameters appear under several names in the state dict but once in a graph.
    for alias in list(state):
        if alias not in found:
            twin = next((k for k, p in model.state_dict(keep_vars=True).items()
                         if k in found and p is model.state_dict(keep_vars=True)[alias]), None)
            if twin is None:
                raise UsageError(f"parameter {alias} is in no graph of {m.directory}; verify needs the training checkpoint")
            found[alias] = found[twin]
    model.load_state_dict(found)
    return model
