"""tk installs like a library (issue 40): the wheel translates with its own default model in an environment
without torch, from a directory outside the clone, and installs no top-level `models` package.

The wheel's dependencies come from this test environment, offline: a fresh virtual environment sees only the
distributions the wheel requires (and the serve extra), linked from here, so torch is not among them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_of_the_tree_is_in_the_wheel_list():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(REPO).parts[:-1]) for p in (REPO / "toolkit").rglob("__init__.py")}
    data = {"toolkit.models", "toolkit.shipped", "toolkit.shipped.transformer", "toolkit.web", "toolkit.web.site",
            "toolkit.runtimes.onnxruntime.kernels"}  # no __init__.py
    assert found | data == listed
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"toolkit.models": "models", "toolkit.shipped": "exported"}


def test_torch_is_only_in_the_build_side_extra():
    base = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    assert not base & {"torch", "onnxscript"}
    assert {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["optional-dependencies"]["torch"]} == {"torch", "onnxscript"}
    assert any("torch" in r for r in PYPROJECT["project"]["optional-dependencies"]["dev"])


def _closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions these requirements need, recursively (extras of dependencies left out)."""
    found: dict[str, metadata.Distribution] = {}
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # another platform's alternative (onnxruntime vs onnxruntime-gpu)
        found[name] = dist
        stack.extend(Requirement(r) for r in dist.requires or [])
    return found


def _link_distributions(dists: dict[str, metadata.Distribution], into: Path) -> None:
    into.mkdir()
    for dist in dists.values():
        root = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            target = into / top
            if (root / top).exists() and not target.exists() and not top.endswith(".pth"):
                target.symlink_to(root / top)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Installed:
    """The wheel, built from a copy of the clone and installed in a fresh virtual environment without torch."""

    names: list[str]  # the wheel's entries
    site: Path  # the virtual environment's site-packages
    bin_dir: Path
    outside: Path  # a directory outside the clone, where the commands run
    env: dict[str, str]

    def run(self, *args, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=self.outside, env=self.env, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("toolkit", "models"):  # toolkit/web/node_modules (npm's, ignored by git) is no source of the wheel
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    shutil.copytree(REPO / "exported" / "transformer", source / "exported" / "transformer")
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next(dist.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip() for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    requires += PYPROJECT["project"]["optional-dependencies"]["serve"]
    deps = _closure(requires)
    assert "torch" not in deps and "onnxscript" not in deps
    _link_distributions(deps, tmp_path / "deps")
    (site / "tk-deps.pth").write_text(str(tmp_path / "deps") + "\n")
    bin_dir = venv / "bin"
    done = subprocess.run([str(bin_dir / "pip"), "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TK_MODEL", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return Installed(names, site, bin_dir, outside, env)


@pytest.mark.timeout(420)  # the first test to ask builds and installs the wheel
def test_the_wheel_translates_serves_and_loads_without_torch_from_anywhere(installed):
    names, bin_dir, outside, env, run = installed.names, installed.bin_dir, installed.outside, installed.env, installed.run
    assert "toolkit/shipped/transformer/weights.bin" in names and "toolkit/models/transformer.py" in names
    assert not [n for n in names if n.startswith("models/")]

    translated = run(str(bin_dir / "tk"), "translate", "Hello.")
    assert translated.returncode == 0, translated.stderr
    assert translated.stdout.strip() and translated.stdout.strip() != "Hello.", translated.stdout
    assert "site-packages/toolkit/shipped/transformer" in translated.stderr  # the installed model, not a clone's
    api = run(str(bin_dir / "python"), "-c", "from toolkit import Translator; import sys; "
              "print(Translator().translate(['Hello.'])[0]); print('torch' in sys.modules); "
              "from toolkit.runtimes.onnxruntime import native; print(native.status())")
    assert api.returncode == 0 and api.stdout.split("\n")[:2] == [translated.stdout.strip(), "False"], api.stdout + api.stderr
    # The attention kernels' source travels in the wheel and builds from it (this machine has a C compiler).
    assert "toolkit/runtimes/onnxruntime/kernels/attention.c" in names
    assert api.stdout.split("\n")[2].startswith("tk attention kernels: on (built with"), api.stdout
    for module in ("torch", "models"):
        assert run(str(bin_dir / "python"), "-c", f"import {module}").returncode != 0, module
    assert run(str(bin_dir / "pip"), "show", "torch").returncode != 0
    hint = run(str(bin_dir / "tk"), "train", "nw", "--out", str(outside / "run"))
    assert hint.returncode == 2 and "pip install 'tk-onnx-deploy[torch]'" in hint.stderr, hint.stderr
    assert "Traceback" not in hint.stderr

    port = _free_port()
    server = subprocess.Popen([str(bin_dir / "tk"), "serve", "--port", str(port)], cwd=outside, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, health = time.time() + 90, None
        while time.time() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    health = response.status
                    break
            except OSError:
                time.sleep(0.3)
        assert health == 200, server.stderr.read() if server.poll() is not None else "no answer"
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.timeout(420)  # the first test to ask builds and installs the wheel
def test_the_wheel_carries_the_browser_site_and_tk_export_web_works_from_it(installed):
    """The site's files are package data (found through importlib.resources in the installed package, not beside a
    clone); onnxruntime-web comes from npm, and the installed tk says where in one line: `npm ci --prefix` on its own
    toolkit/web. Here npm's result is the clone's node_modules, linked where that command would install it."""
    web = REPO / "toolkit" / "web"
    carried = {str(p.relative_to(REPO)) for p in web.rglob("*") if p.is_file() and "node_modules" not in p.relative_to(web).parts}
    assert carried >= {"toolkit/web/site/index.html", "toolkit/web/package.json", "toolkit/web/package-lock.json"}
    assert {n for n in installed.names if n.startswith("toolkit/web/")} == carried  # every file of the site, no npm download
    model, site = installed.site / "toolkit" / "shipped" / "transformer", installed.outside / "site"
    tk = installed.bin_dir / "tk"

    refused = installed.run(tk, "export", model, "--web", site)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"npm ci --prefix {installed.site / 'toolkit' / 'web'}" in refused.stderr and not site.exists()

    (installed.site / "toolkit" / "web" / "node_modules").symlink_to(web / "node_modules", target_is_directory=True)
    written = installed.run(tk, "export", model, "--web", site)
    assert written.returncode == 0, written.stderr
    for name in carried - {"toolkit/web/package.json", "toolkit/web/package-lock.json"}:
        path = Path(name).relative_to("toolkit/web")
        shipped = site / ("vendor" if path.name.startswith("LICENSE") else "") / path.name
        assert shipped.read_bytes() == (REPO / name).read_bytes(), name
    assert (site / "vendor" / "ort-wasm-simd-threaded.wasm").is_file() and json.loads((site / "model.json").read_text())["variants"]


@pytest.mark.timeout(420)  # the first test to ask builds and installs the wheel
def test_the_base_install_tokenizes_every_kind_without_torch(installed):
    """Every tokenizer kind a model directory declares runs on the base install: Moses tokenisation (sacremoses, an
    imported FSMT's) and the tokenizers library (a tokenizer.json) come with it, not with the torch extra."""
    code = "import sacremoses, tokenizers, sentencepiece, sys; print('torch' in sys.modules)"
    done = installed.run(str(installed.bin_dir / "python"), "-c", code)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr
