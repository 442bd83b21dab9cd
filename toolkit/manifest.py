"""manifest.json: an exported model directory describes itself. Torch-free: translate reads it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.graphs import GraphSpec

FORMAT = "tk-export/1"
NAME = "manifest.json"
# Graph file suffix of each precision variant; "fp32" is the plain export.
VARIANTS = {"fp32": "", "fp16": ".fp16", "optimized": ".opt", "int8": ".int8"}


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
        return ["fp32", *self.data.get("variants", {})]

    def variants_for(self, provider: str) -> list[str]:
        """fp32 and the variants exported for this provider (fp16 for cuda; optimized and int8 for cpu)."""
        return ["fp32", *(v for v, d in self.data.get("variants", {}).items() if d.get("provider") == provider)]

    def graph_path(self, graph: str, variant: str = "fp32") -> Path:
        if variant != "fp32" and variant not in self.data.get("variants", {}):
            have = ", ".join(self.variants())
            raise UsageError(f"{self.directory} has no {variant} variant (has: {have}); re-export with the matching option")
        entry = self.data["graphs"][graph] if variant == "fp32" else self.data["variants"][variant]["graphs"][graph]
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
    if data.get("format") != FORMAT:
        raise UsageError(f"{path} has format {data.get('format')!r}, expected {FORMAT!r}; re-export with this tk")
    return Manifest(directory, data)


def write(directory: Path, data: dict) -> None:
    """Atomically: a crash mid-write (or a full disk) leaves the previous manifest intact."""
    tmp = directory / f".{NAME}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, **data}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, directory / NAME)
