"""`tk export hf:DIR`: which architecture's builder reads the directory, from config.json's model_type and the
architecture table (toolkit.core.architectures); never from code in the directory."""

from __future__ import annotations

import importlib
from pathlib import Path

from toolkit.core import architectures
from toolkit.pytorch import hf_files
from toolkit.pytorch.hf_files import PREFIX

__all__ = ["PREFIX", "architecture_of", "read"]


def architecture_of(source: str | Path) -> architectures.Architecture:
    directory = hf_files.directory_of(source)
    config = hf_files.read_json(directory, "config.json")
    return architectures.for_hf_model_type(config.get("model_type"), f"{directory}/config.json")


def read(source: str | Path):
    """The directory read by its architecture's builder (an HfSource: model, settings, rules, tokenizer, files)."""
    return importlib.import_module(architecture_of(source).builder).read(source)
