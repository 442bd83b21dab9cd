"""`tk export MODEL_DIR --web OUT_DIR`: a static site that translates in the browser.

The site holds the model directory's fp32 graphs and their one weights file as they are, the
int8 graphs (stored in the directory, or built from the fp32 ones as `--variant int8` does),
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

from toolkit.core import manifest as manifest_mod
from toolkit.core.batching import GUARDED
from toolkit.core.errors import UsageError
from toolkit.deploy.web_tokenizer import write_tokenizer_json

WEB = Path(__file__).resolve().parents[2] / "web"
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


# int8 runs on onnxruntime-web's WebAssembly backend and its graphs are a third of fp32's; fp16
# runs too, but is larger than int8 and unverified in the browser, so it is not shipped.
WEB_VARIANTS = ("fp32", "int8")


def site_model(m: manifest_mod.Manifest) -> dict:
    """model.json: what the page needs of the manifest (graph files and specs per variant, limits, guards)."""
    graphs = m.graphs
    weights = {g.weights.file for g in graphs.values() if g.weights}
    if len(weights) != 1:
        raise UsageError(f"{m.directory}: the web export expects both graphs in one external weights file, found {sorted(weights) or 'none'}; "
                         "re-export the model directory with this tk")
    variants = {"fp32": {"graphs": {name: g.file for name, g in graphs.items()}, "weights": weights.pop()}}
    # A variant's graphs hold their own weights (the quantiser writes them inline).
    variants.update({v: {"graphs": {name: f"{name}.{v}.onnx" for name in graphs}, "weights": None} for v in WEB_VARIANTS[1:]})
    return {
        "name": m.directory.name, "model": m.model, "max_len": m.max_len, "variants": variants,
        "tokenizer": "tokenizer.json", "encoder": graphs["encoder"].spec, "decoder": graphs["decoder"].spec,
        "guards": GUARDED,
    }


def _write_graph(m: manifest_mod.Manifest, graph: str, variant: str, out: Path) -> None:
    """A variant's graph as stored in the directory, else built from its fp32 graph."""
    from toolkit.runtimes.onnxruntime.variants import graph_source

    source, _ = graph_source(m, graph, variant)
    if isinstance(source, bytes):
        out.write_bytes(source)
    else:
        shutil.copyfile(source, out)


def export_web(model_dir: Path, out: Path, force: bool = False, echo: Callable[[str], None] = lambda s: None) -> dict[str, int]:
    """Writes the site to out (built under a temporary name, then renamed); returns {file: bytes}."""
    m = manifest_mod.load(model_dir)
    tok = m.translation_tokenizer()
    if m.declared().tokenizer.kind != "sentencepiece" or m.rules() != manifest_mod.Declaration().decoding:
        raise UsageError(f"{model_dir} is a {m.model} model with a tokenizer or decoding rules of its own; the browser site runs "
                         "tk's tokenizer and rules only (serve it with tk serve instead)")
    version = ort_web_version()
    if out.exists() and not force:
        raise UsageError(f"{out} already exists; use --force to replace it")
    if out.exists() and not (out / "model.json").is_file():
        raise UsageError(f"{out} exists and is not a tk web site (no model.json); --force replaces only a site, choose another directory")
    m.check_files()
    model = site_model(m)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        echo(f"writing the web site for {model_dir} (onnxruntime-web {version}) ...")
        fp32 = model["variants"]["fp32"]
        for name in [*fp32["graphs"].values(), fp32["weights"], *(e.file for e in m.extra_files)]:
            shutil.copyfile(m.directory / name, tmp / name)
        for variant, entry in model["variants"].items():
            if variant != "fp32":
                for graph, name in entry["graphs"].items():
                    _write_graph(m, graph, variant, tmp / name)
            entry["bytes"] = sum((tmp / f).stat().st_size for f in [*entry["graphs"].values(), entry["weights"]] if f)
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


def downloads(site: Path) -> dict[str, int]:
    """Bytes a page load fetches, per variant: the runtime, the page, the tokenizer and that variant's graphs."""
    model = json.loads((site / "model.json").read_text(encoding="utf-8"))
    shared = sum(p.stat().st_size for p in [*site.glob("*.mjs"), site / "index.html", site / "model.json", site / model["tokenizer"],
                                            *(site / "vendor").glob("*.mjs"), *(site / "vendor").glob("*.wasm")])
    return {v: shared + entry["bytes"] for v, entry in model["variants"].items()}

