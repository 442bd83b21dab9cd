"""What a user following the README meets when an extra is missing or a source is given the wrong way: one line that
names what is missing in the terms the user used (the flag given, the package to install by its published name, the
prefix to add), and a fix that works outside a clone of this repository."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers import one_line_error

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"


def test_every_install_hint_names_the_published_package_not_a_clone():
    """`pip install -e '.[serve]'` fails anywhere but in a clone; `pip install 'tk-onnx-deploy[serve]'` works everywhere."""
    clone_only, unnamed = [], []
    for path in sorted((REPO / "toolkit").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            if "pip install -e" in line:
                clone_only.append(where)
            for extra in re.findall(r"pip install '[^']*\[(\w+)\]'", line):
                if f"pip install 'tk-onnx-deploy[{extra}]'" not in line:
                    unnamed.append(where)
    assert clone_only == [] and unnamed == []


def test_a_missing_ray_extra_is_named_with_the_package(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as where the ray extra is not installed
    (tmp_path / "in.txt").write_text("Hello.\n")
    line = one_line_error(cli("translate-corpus", SHIPPED, tmp_path / "in.txt", tmp_path / "out"), 2)
    assert "pip install 'tk-onnx-deploy[ray]'" in line, line


def test_a_missing_serve_extra_is_named_with_the_package(cli, monkeypatch):
    for name in [n for n in sys.modules if n.startswith("toolkit.serve")]:
        monkeypatch.delitem(sys.modules, name)  # imported afresh, finding no web framework
    for name in ("fastapi", "uvicorn"):
        monkeypatch.setitem(sys.modules, name, None)
    line = one_line_error(cli("serve", SHIPPED, "--port", "0"), 2)
    assert "pip install 'tk-onnx-deploy[serve]'" in line, line


def test_to_hf_names_only_the_package_that_is_missing(cli, tmp_path, monkeypatch):
    """tokenizers is installed (a base dependency): the error must not send the user after it."""
    for name in ("safetensors", "safetensors.numpy"):
        monkeypatch.setitem(sys.modules, name, None)
    line = one_line_error(cli("export", SHIPPED, "--to-hf", tmp_path / "hf"), 2)
    assert "--to-hf needs safetensors," in line and "tokenizers" not in line, line
    assert "pip install 'tk-onnx-deploy[hf]'" in line and "pip install safetensors" in line, line
    assert not (tmp_path / "hf").exists()


def test_export_ctranslate2_without_ctranslate2_speaks_of_the_flag_given(cli, tmp_path, monkeypatch):
    """`tk export DIR --ctranslate2` was answered with "--runtime ctranslate2 needs ...", a flag the user never gave."""
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    directory = tmp_path / "transformer"
    shutil.copytree(SHIPPED, directory)
    line = one_line_error(cli("export", directory, "--ctranslate2"), 2)
    assert line.startswith("error: --ctranslate2 needs the ctranslate2 package") and "--runtime" not in line, line
    assert "pip install 'tk-onnx-deploy[ct2]'" in line, line


@pytest.mark.parametrize("with_out", [True, False])
def test_a_hugging_face_directory_given_without_its_prefix_is_told_to_add_hf(cli, tmp_path, monkeypatch, with_out):
    """`tk export hf-tiny` (a save_pretrained directory) said "checkpoint hf-tiny/checkpoint.pt does not exist"."""
    monkeypatch.chdir(tmp_path)
    Path("hf-tiny").mkdir()
    Path("hf-tiny/config.json").write_text('{"model_type": "marian"}')
    line = one_line_error(cli("export", "hf-tiny", *(["--out", "marian"] if with_out else [])), 2)
    assert f"tk export hf:hf-tiny --out {'marian' if with_out else 'DIR'}" in line and "checkpoint.pt" not in line, line
    assert not Path("marian").exists()


def test_a_hub_id_is_told_to_download_with_the_hf_command(cli, tmp_path):
    """huggingface-hub 1.x and later ship `hf`; `huggingface-cli` is gone from them."""
    pytest.importorskip("torch", reason="tk export hf:DIR is the build side (the torch extra)")
    line = one_line_error(cli("export", "hf:Helsinki-NLP/opus-mt-en-de", "--out", tmp_path / "marian"), 2)
    assert "hf download" in line and "huggingface-cli" not in line, line
