"""history.json in a run directory: the per-epoch losses `tk train` records and `tk plot` draws. Torch-free."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.core.atomic import write_atomic
from toolkit.core.errors import DataError, UsageError

NAME = "history.json"


def write(run_dir: str | Path, model: str, history: list[dict]) -> None:
    """Atomically, beside the checkpoint, after every epoch."""
    write_atomic(Path(run_dir) / NAME, (json.dumps({"model": model, "epochs": history}, indent=1) + "\n").encode("utf-8"))


def read(run_dir: str | Path) -> dict:
    """A run directory's history.json, or the history an exported model's manifest.json carries."""
    path = Path(run_dir) / NAME
    if not path.is_file() and (Path(run_dir) / "manifest.json").is_file():
        from toolkit.core import manifest

        m = manifest.load(run_dir)
        epochs = (m.training.history if m.training else None) or []
        if not epochs:
            raise DataError(f"{run_dir}/manifest.json records no training history (this model was not trained by epochs)")
        return {"model": m.model, "epochs": epochs}
    if not path.is_file():
        raise UsageError(f"{run_dir} has no {NAME}; give a run directory that `tk train --out DIR` wrote, or an exported model")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); train again or fix the file") from None
    if not isinstance(data, dict) or not data.get("epochs"):
        raise DataError(f"{path} records no epoch; train for at least one epoch first")
    return data
