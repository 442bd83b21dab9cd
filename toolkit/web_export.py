"""`tk export MODEL_DIR --web OUT_DIR`: a static site that translates in the browser.

The site holds the model directory's fp32 graphs and their one weights file as they are,
the tokenizer as JSON, the page and its JavaScript (web/site), and onnxruntime-web's files
vendored from web/node_modules at the version web/package-lock.json fixes, with its license.
Any static file server serves it. Reads the exported directory only: torch-free.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from toolkit import manifest as manifest_mod
from toolkit.batching import GUARDED
from toolkit.errors import UsageError
from toolkit.web_tokenizer import write_tokenizer_json

WEB = Path(__file__).resolve().parents[1] / "web"
SITE = WEB / "site"
ORT_DIST = WEB / "node_modules" / "onnxruntime-web" / "dist"
# The WebAssembly build only (no WebGL/WebGPU code): the ES module, its loader and the binary.
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
NPM_FIX = f"run `npm ci --prefix {WEB}` (the npm registry is needed once; web/package-lock.json fixes the version)"


def ort_web_version() -> str:
    package = ORT_DIST.parent / "package.json"
    missing = [f for f in ORT_FILES if not (ORT_DIST / f).is_file()]
    if missing or not package.is_file():
        raise UsageError(f"onnxruntime-web is not installed in {WEB / 'node_modules'}; {NPM_FIX}")
    return json.loads(package.read_text(encoding="utf-8"))["version"]


def site_model(m: manifest_mod.Manifest, variant: str) -> dict:
    """model.json: what the page needs of the manifest (graph files and specs, limits, guards)."""
    graphs = m.data["graphs"]
    weights = {g["weights"]["file"] for g in graphs.values() if "weights" in g}
    if len(weights) != 1:
        raise UsageError(f"{m.directory}: the web export expects both graphs in one external weights file, found {sorted(weights) or 'none'}; "
                         "re-export the model directory with this tk")
    return {
        "name": m.directory.name, "model": m.model, "variant": variant, "max_len": m.max_len,
        "graphs": {name: g["file"] for name, g in graphs.items()}, "weights": weights.pop(),
        "tokenizer": "tokenizer.json", "encoder": graphs["encoder"]["spec"], "decoder": graphs["decoder"]["spec"],
        "guards": GUARDED,
    }


def export_web(model_dir: Path, out: Path, force: bool = False, echo: Callable[[str], None] = lambda s: None) -> dict[str, int]:
    """Writes the site to out (built under a temporary name, then renamed); returns {file: bytes}."""
    m = manifest_mod.load(model_dir)
    if m.kind != "seq2seq":
        raise UsageError(f"{model_dir} holds a '{m.model}' graph, not a translation model; use exported/transformer or exported/seq2seq")
    tok = m.tokenizer_path()
    if tok is None:
        raise UsageError(f"{model_dir} has no tokenizer (exported with --random-init); export a trained checkpoint")
    version = ort_web_version()
    if out.exists() and not force:
        raise UsageError(f"{out} already exists; use --force to replace it")
    if out.exists() and not (out / "model.json").is_file():
        raise UsageError(f"{out} exists and is not a tk web site (no model.json); --force replaces only a site, choose another directory")
    m.check_files()
    model = site_model(m, "fp32")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        echo(f"writing the web site for {model_dir} (onnxruntime-web {version}) ...")
        for name in [*model["graphs"].values(), model["weights"], *(e["file"] for e in m.data.get("extra_files", []))]:
            shutil.copyfile(m.directory / name, tmp / name)
        write_tokenizer_json(tok, tmp / model["tokenizer"])
        (tmp / "model.json").write_text(json.dumps({**model, "onnxruntime_web": version}, indent=1), encoding="utf-8")
        for f in SITE.iterdir():
            shutil.copyfile(f, tmp / f.name)
        (tmp / "vendor").mkdir()
        for f in ORT_FILES:
            shutil.copyfile(ORT_DIST / f, tmp / "vendor" / f)
        shutil.copyfile(WEB / "LICENSE-onnxruntime-web.txt", tmp / "vendor" / "LICENSE-onnxruntime-web.txt")
        tmp.chmod(0o755)  # mkdtemp makes it private; a web server must read it
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
