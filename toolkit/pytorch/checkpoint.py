"""Checkpoints: everything needed to rebuild a model, written atomically."""

from __future__ import annotations

import hashlib
import pickle
import re
import sys
from pathlib import Path

import torch

from toolkit.core.atomic import atomic_file
from toolkit.core.errors import UsageError, first_line
from toolkit.core.manifest import file_sha256

FORMAT = "tk-checkpoint/1"


def save(payload: dict, path: Path) -> None:
    """Writes to a temporary file in the same directory, then renames over the target,
    so an interrupted write never leaves a truncated checkpoint behind."""
    if "state_dict" in payload:
        # Load recomputes it: a flipped byte in any tensor is refused instead of exported.
        payload = {**payload, "weights_sha256": state_dict_sha256(payload["state_dict"])}
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, **payload}, f)


def load(path: str | Path, warn=lambda m: print(m, file=sys.stderr)) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.is_file():
        raise UsageError(f"checkpoint {path} does not exist; train one with `tk train MODEL --out DIR`")
    try:
        # weights_only: a checkpoint is a file from outside, and a full unpickle runs whatever code it names.
        # Its own digest cannot vouch for it (whoever wrote the file wrote the digest), so nothing but
        # tensors, containers and plain values is ever built from it; a tk checkpoint holds nothing else.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        named = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f" ({named.group(1)})" if named else ""
        raise UsageError(f"checkpoint {path} holds Python objects other than tensors and plain values{what}; "
                         "tk never unpickles those: load it in your own code and save its state_dict with tk's format") from None
    except Exception as e:  # torch raises several unrelated types for a corrupt file
        raise UsageError(f"checkpoint {path} is corrupt or not a tk checkpoint ({type(e).__name__}); retrain or restore it") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UsageError(f"{path} is not a tk checkpoint (expected format {FORMAT})")
    for key, kind in (("model", str), ("config", dict), ("state_dict", dict)):
        if not isinstance(ckpt.get(key), kind):
            raise UsageError(f"checkpoint {path} lacks a valid '{key}' entry; retrain or restore it")
    recorded = ckpt.get("weights_sha256")
    if recorded is None:
        warn(f"warning: checkpoint {path} carries no weights digest (written by an older tk); its tensors cannot be checked")
    else:
        try:
            actual = state_dict_sha256(ckpt["state_dict"])
        except Exception:  # a tensor that is not one: as corrupt as a wrong digest
            actual = None
        if actual != recorded:
            raise UsageError(f"checkpoint {path} fails its weights digest (a tensor was modified or corrupted); "
                             "restore it from a good copy or retrain")
    ckpt["path"] = str(path)
    return ckpt


def sha256(path: str | Path) -> str:
    """The file's sha256 (one implementation, the manifest's, for checkpoints and graphs alike)."""
    return file_sha256(Path(path))


def build_model(ckpt: dict):
    """(registry entry, config, model with the checkpoint's weights, in eval mode)."""
    from toolkit.pytorch import registry

    entry = registry.get(ckpt["model"])
    where = ckpt.get("path", "the checkpoint")
    cfg = entry.checked_config(ckpt["config"], where)
    model = entry.build(cfg)
    try:
        model.load_state_dict(ckpt["state_dict"])
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{where}: its weights do not fit a '{ckpt['model']}' model with its config "
                         f"({first_line(e, 120)}); retrain or restore it") from None
    return entry, cfg, model.eval()


def weights_sha256(model: torch.nn.Module) -> str:
    """Digest of every parameter and persistent buffer, in name order: identifies the weights, not the file."""
    return state_dict_sha256(model.state_dict())


def state_dict_sha256(state: dict) -> str:
    """weights_sha256 of a state dict: equal to the digest of a model that loaded it."""
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
