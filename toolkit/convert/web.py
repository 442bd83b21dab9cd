"""`tk export MODEL_DIR --web OUT_DIR`: a static site that translates in the browser.

The site holds the model directory's fp32 graphs and their one weights file as they are, the
int8 graphs (stored in the directory, or built from the fp32 ones as `--variant int8` does),
the tokenizer as JSON (an imported model's as a tokenizer.json: toolkit.convert.web_tokenizer), the page and its
JavaScript (toolkit/web/site), and onnxruntime-web's and sentencex's WebAssembly builds (and, for an imported model,
@huggingface/tokenizers') vendored from toolkit/web/node_modules at the version toolkit/web/package-lock.json fixes, with their licenses.
Any static file server serves it. Reads the exported directory only: torch-free.

The page's files are package data of toolkit (the wheel carries toolkit/web: the site, package.json and
package-lock.json), found through importlib.resources, so an installed tk writes the site as a clone does.
onnxruntime-web comes from npm, into toolkit/web/node_modules: `npm ci --prefix toolkit/web` in a clone, and
in an installed tk the same command on the installed toolkit/web, which the refusal names.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from toolkit.convert.pipeline import NewDirectory, Writer
from toolkit.convert.web_tokenizer import site_tokenizer, site_tokenizer_problem
from toolkit.core import architectures, placeholders
from toolkit.core import manifest as manifest_mod
from toolkit.core.batching import GUARDED
from toolkit.core.errors import UsageError
from toolkit.core.tokenizers import language_rule

WEB = resources.files("toolkit") / "web"  # a clone's toolkit/web, or the installed package's
SITE = WEB / "site"
ORT_DIST = Path(str(WEB)) / "node_modules" / "onnxruntime-web" / "dist"
# onnxruntime-web's builds the page runs, per device (each the ES module, its loader and the binary); a page load fetches
# one: WebAssembly by default, WebGPU (whose binary also holds the WebAssembly kernels ORT places the operators WebGPU lacks
# on) only when chosen (index.html?device=webgpu) and the browser offers an adapter.
ORT_BUILDS = {"wasm": ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"),
              "webgpu": ("ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")}
ORT_FILES = tuple(f for build in ORT_BUILDS.values() for f in build)
# @huggingface/tokenizers (pure JavaScript, reads tokenizer.json): an imported model's tokenizer; tk's own models run
# site/tokenizer.mjs, sentencepiece's exact port.
TOKENIZERS_DIST = Path(str(WEB)) / "node_modules" / "@huggingface" / "tokenizers"
TOKENIZERS_FILES = {"tokenizers.min.mjs": "dist/tokenizers.min.mjs", "LICENSE-huggingface-tokenizers.txt": "LICENSE"}
# sentencex's WebAssembly build (the Rust library tk's Python side splits sentences with, compiled): the page cuts a line
# into sentences by the same rules (site/textprep.mjs).
SENTENCEX_DIST = Path(str(WEB)) / "node_modules" / "sentencex-wasm"
SENTENCEX_FILES = {"sentencex_wasm.js": "sentencex_wasm.js", "sentencex_wasm_bg.wasm": "sentencex_wasm_bg.wasm",
                   "LICENSE-sentencex.txt": "LICENSE"}
NPM_FIX = f"run `npm ci --prefix {WEB}` (the npm registry is needed once; the package-lock.json there fixes the version)"


def ort_web_version() -> str:
    package = ORT_DIST.parent / "package.json"
    missing = [f for f in ORT_FILES if not (ORT_DIST / f).is_file()]
    if missing or not package.is_file():
        raise UsageError(f"onnxruntime-web is not installed in {ORT_DIST.parents[1]}; {NPM_FIX}")
    if not all((TOKENIZERS_DIST / f).is_file() for f in TOKENIZERS_FILES.values()):
        raise UsageError(f"@huggingface/tokenizers is not installed in {ORT_DIST.parents[1]}; {NPM_FIX}")
    if not all((SENTENCEX_DIST / f).is_file() for f in SENTENCEX_FILES.values()):
        raise UsageError(f"sentencex-wasm is not installed in {ORT_DIST.parents[1]}; {NPM_FIX}")
    return json.loads(package.read_text(encoding="utf-8"))["version"]


def tokenizer_json(model_path: Path) -> dict:
    """The tokenizer as toolkit/web/site/tokenizer.mjs reads it, through sentencepiece's own protobuf description (the
    model's pieces as [piece, score, type], the normaliser's flags, byte fallback), not a re-derivation."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    try:
        proto.ParseFromString(Path(model_path).read_bytes())
    except Exception as e:  # a truncated or foreign file: protobuf raises DecodeError
        raise UsageError(f"tokenizer {model_path} is unreadable or corrupt ({type(e).__name__}); re-export the model directory") from None
    if proto.trainer_spec.model_type != pb.TrainerSpec.UNIGRAM:
        raise UsageError(f"tokenizer {model_path} is not a unigram model; the browser tokenizer implements unigram only")
    norm = proto.normalizer_spec
    if norm.precompiled_charsmap:
        # A character map (nmt_nfkc and the like) would need its own JavaScript port; tk trains with "identity".
        raise UsageError(f"tokenizer {model_path} uses the '{norm.name}' normalisation rule; the browser tokenizer supports 'identity' only")
    return {
        "pieces": [[p.piece, p.score, p.type] for p in proto.pieces],
        "byte_fallback": proto.trainer_spec.byte_fallback,
        "normalizer": {"name": norm.name, "add_dummy_prefix": norm.add_dummy_prefix,
                       "remove_extra_whitespaces": norm.remove_extra_whitespaces,
                       "escape_whitespaces": norm.escape_whitespaces},
    }


def write_tokenizer_json(model_path: Path, out: Path) -> None:
    out.write_text(json.dumps(tokenizer_json(model_path), ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


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
    # The decoding rules and languages as the manifest declares them: the page decodes by these, as tk translate does.
    return {
        "name": m.directory.name, "model": m.model, "max_len": m.max_len, "max_output_len": m.max_output_len,
        "variants": variants, "tokenizer": {"file": "tokenizer.json"}, "encoder": graphs["encoder"].spec,
        "decoder": graphs["decoder"].spec, "guards": GUARDED, "rules": m.rules().to_dict(), "languages": site_languages(m),
    }


def site_languages(m: manifest_mod.Manifest) -> dict | None:
    """The languages the page offers: the codes it translates from and into, the pair the directory states (the page's
    default), and for a multilingual model each code's token and the rule a target sets (language_rule); None for a
    model that states none."""
    declared = m.declared().tokenizer
    served = declared.served()
    if served is None:
        return None
    codes = declared.languages
    return {**served, "source_lang": declared.source_lang, "target_lang": declared.target_lang, "tokens": codes,
            "sets": None if codes is None else language_rule(declared, m.rules())}


def _write_graph(m: manifest_mod.Manifest, graph: str, variant: str, out: Path) -> None:
    """A variant's graph as stored in the directory, else built from its fp32 graph."""
    from toolkit.graphs.variants import graph_source

    source, _ = graph_source(m, graph, variant)
    if isinstance(source, bytes):
        out.write_bytes(source)
    else:
        shutil.copyfile(source, out)


def check_tokenizer(m: manifest_mod.Manifest) -> None:
    """A tokenizer the page runs: tk's SentencePiece model (tokenizer.mjs, which appends no end token to the source), or
    one toolkit.convert.web_tokenizer converts for @huggingface/tokenizers."""
    declared = m.declared().tokenizer
    if declared.kind == "sentencepiece" and declared.source_end:
        raise UsageError(f"{m.directory} is a {m.model} model whose SentencePiece source ends with an end token; the browser "
                         "site's tokenizer appends none (serve it with tk serve instead)")
    if declared.kind != "sentencepiece" and site_tokenizer(m) is None:
        raise UsageError(f"{m.directory} is a {m.model} model whose tokenizer ({declared.kind}) the browser site has no port of "
                         "(serve it with tk serve instead)")


def _check(m: manifest_mod.Manifest) -> None:
    """validate: an architecture whose graphs and rules the page runs, a tokenizer it runs, one weights file,
    onnxruntime-web and @huggingface/tokenizers installed."""
    m.translation_tokenizer()  # first: a model that does not translate is told so, as tk translate tells it
    architectures.get(m.model).check("web")  # the page decodes by the model's declared rules (decoding.mjs)
    check_tokenizer(m)
    ort_web_version()
    site_model(m)


def _write(m: manifest_mod.Manifest, tmp: Path, echo: Callable[[str], None]) -> dict:
    """write: the site into `tmp` (moved into place by toolkit.convert.convert); returns model.json's content."""
    version, model = ort_web_version(), site_model(m)
    fp32 = model["variants"]["fp32"]
    echo(f"writing the web site for {m.directory} (onnxruntime-web {version}) ...")
    for name in [*fp32["graphs"].values(), fp32["weights"], *(e.file for e in m.extra_files)]:
        shutil.copyfile(m.directory / name, tmp / name)
    for variant, entry in model["variants"].items():
        if variant != "fp32":
            for graph, name in entry["graphs"].items():
                _write_graph(m, graph, variant, tmp / name)
        entry["bytes"] = sum((tmp / f).stat().st_size for f in [*entry["graphs"].values(), entry["weights"]] if f)
    model["tokenizer"] = write_site_tokenizer(m, tmp / model["tokenizer"]["file"])
    model["text"] = site_text(m)
    model["confidence"] = site_confidence(m)
    model["glossary"] = site_glossary(m)
    model["words"] = site_words(m)
    model["retry"] = site_retry()
    model["onnxruntime_web"] = version
    (tmp / "model.json").write_text(json.dumps(model, indent=1), encoding="utf-8")
    for f in SITE.iterdir():  # package data: read through importlib.resources, not from a path of the clone
        (tmp / f.name).write_bytes(f.read_bytes())
    (tmp / "vendor").mkdir()
    for f in ORT_FILES:
        shutil.copyfile(ORT_DIST / f, tmp / "vendor" / f)
    (tmp / "vendor" / "LICENSE-onnxruntime-web.txt").write_bytes((WEB / "LICENSE-onnxruntime-web.txt").read_bytes())
    for name, source in vendored_tokenizers(model).items():
        shutil.copyfile(TOKENIZERS_DIST / source, tmp / "vendor" / name)
    for name, source in SENTENCEX_FILES.items():
        shutil.copyfile(SENTENCEX_DIST / source, tmp / "vendor" / name)
    return model


def site_text(m: manifest_mod.Manifest) -> dict:
    """What the page's text preparation (site/textprep.mjs) takes from Python rather than spelling it twice: whether the
    model was trained on tk's placeholders (then a sentence's numbers, URLs, e-mail addresses and words the tokenizer does
    not spell are protected, and its capitals folded, as textprep.prepare does), the patterns of textprep.clean and
    placeholders.all_spans, PER_INPUT, and textprep.unspelled's alphabet and surrounding punctuation."""
    from toolkit.core import textprep
    from toolkit.core.tokenizers import open_tokenizer

    alphabet = open_tokenizer(m).alphabet
    return {"placeholders": m.declared().placeholders, "per_input": placeholders.PER_INPUT, "format": placeholders.FORMAT_RE.pattern,
            "spans": _js_pattern(placeholders.SPAN_RE.pattern), "unspaced": placeholders._UNSPACED.pattern,
            "alphabet": "".join(sorted(alphabet)) if alphabet is not None else None, "around": textprep.AROUND}


def site_confidence(m: manifest_mod.Manifest) -> dict:
    """What the page's confidence (site/confidence.mjs) takes from Python: the model's calibration (its stored one, else
    the default map) and the constants of toolkit.core.confidence."""
    from toolkit.core import confidence

    calibration = confidence.for_manifest(m)
    return {"bias": calibration.bias, "weights": list(calibration.weights), "score_floor": confidence.SCORE_FLOOR,
            "guarded_max": confidence.GUARDED_MAX,
            "untranslated_max": confidence.UNTRANSLATED_MAX, "repaired_max": confidence.REPAIRED_MAX, "failed": confidence.FAILED,
            "untranslated_share": confidence.UNTRANSLATED_SHARE, "untranslated_words": confidence.UNTRANSLATED_WORDS}


def site_glossary(m: manifest_mod.Manifest) -> dict:
    """What the page's glossary (site/glossary.mjs) takes from Python rather than spelling it twice: the checks' margin
    and beam (toolkit.deploy.translate), the limit of a term (toolkit.core.glossary), and per output id the piece kinds
    constrained decoding asks about (constrained._piece_kinds; whether it begins a word: site_words), as id lists. The
    page reads the patterns of finding terms beside spans, and whether the model was trained on placeholders, from the
    text entry (site_text). A model whose glossary the page cannot put in has only `refused`, the one line the page
    shows."""
    from toolkit.core import constrained, glossary
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.deploy.translate import FORCED_BEAM, FORCED_MARGIN, check_glossary

    try:
        check_glossary(m)
    except UsageError as e:
        return {"refused": str(e)}
    tokenizer = open_tokenizer(m)
    _, apostrophes, ends, bare, stubs = constrained._piece_kinds(tokenizer, _output_vocab(m))
    # The text's own patterns and limits (placeholders, spans, format characters) are model.json's text entry (site_text).
    return {"forced_margin": FORCED_MARGIN, "forced_beam": FORCED_BEAM, "max_term_chars": glossary.MAX_TERM_CHARS,
            "apostrophe": _ids(apostrophes), "sentence_end": _ids(ends), "bare_apostrophe": _ids(bare),
            "elision_stub": _ids(stubs), "elides": constrained.ELIDES,
            "unelided": {short: list(fulls) for short, fulls in constrained.UNELIDED.items()},
            "contracted": [[*pair, whole] for pair, whole in constrained.CONTRACTED.items()],
            "agreeing": [[list(consonant), list(vowel)] for consonant, vowel in constrained.AGREEING], "plural": sorted(constrained.PLURAL),
            "not_a_terms_word": sorted(constrained.NOT_A_TERMS_WORD)}


def site_words(m: manifest_mod.Manifest) -> dict:
    """Per output id, as id lists: those that begin no word and those that end one (TextTokenizer.begins_word and
    ends_word), from which the page tells where a word boundary lies (decoding.mjs wordBoundary): where a translation
    the loop guard stopped ends (wordEnd), and what may follow a glossary term."""
    from toolkit.core.tokenizers import open_tokenizer

    tokenizer, vocab = open_tokenizer(m), _output_vocab(m)
    return {"inside_word": [i for i in range(vocab) if not tokenizer.begins_word(i)],
            "ends_word": [i for i in range(vocab) if tokenizer.ends_word(i)]}


def site_retry() -> dict:
    """How the page decodes again a sentence a guard cut (toolkit.deploy.translate.retried): the wider beam, the widest,
    and the decoder rows of a batch."""
    from toolkit.core.decode_options import BEAM_ROWS, MAX_BEAM
    from toolkit.deploy.translate import RETRY_BEAM

    return {"beam": RETRY_BEAM, "max_beam": MAX_BEAM, "rows": BEAM_ROWS}


def _output_vocab(m: manifest_mod.Manifest) -> int:
    vocab = m.output_vocab()
    if vocab is None:
        raise UsageError(f"{m.directory}'s decoder has no log_probs output for the page's glossary; re-export the model directory")
    return vocab


def _ids(kind) -> list[int]:
    return [int(i) for i in kind.nonzero()[0]]


def _js_pattern(pattern: str) -> str:
    """A Python pattern of str as JavaScript's `u` regular expressions read it: a named group's (?P< as (?<, and \\w and
    \\d (Unicode in Python, ASCII in JavaScript) as the Unicode classes they stand for, inside brackets as they are in
    placeholders.SPAN_RE; an escaped quote, which JavaScript's `u` mode refuses, as the quote."""
    return pattern.replace("(?P<", "(?<").replace(r"\w", r"\p{L}\p{N}_").replace(r"\d", r"\p{Nd}").replace('\\"', '"')


def vendored_tokenizers(model: dict) -> dict[str, str]:
    """The tokenizer library's files a site vendors (site file -> package file): only a site whose tokenizer it runs."""
    return TOKENIZERS_FILES if model["tokenizer"]["kind"] == "tokenizers" else {}


def write_site_tokenizer(m: manifest_mod.Manifest, out: Path) -> dict:
    """The site's tokenizer file at `out`; returns model.json's tokenizer entry (toolkit.convert.web_tokenizer)."""
    converted = site_tokenizer(m)
    if converted is None:  # tk's own SentencePiece model: tokenizer.mjs
        write_tokenizer_json(m.translation_tokenizer(), out)
        declared = m.declared().tokenizer
        return {"file": out.name, "kind": "sentencepiece", "end": m.rules().end if declared.source_end else None,
                "languages": None, "source_lang": declared.source_lang, "target_lang": declared.target_lang}
    data, entry = converted
    out.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    return {"file": out.name, **entry}


def _verify(m: manifest_mod.Manifest, site: Path, model: dict) -> str | None:
    """verify: model.json reads back as written; every file it names is there, each variant's of the size it says; the
    page's files and onnxruntime-web's are there as shipped; tokenizer.json is the export of the directory's tokenizer."""
    read = lambda name: json.loads((site / name).read_text(encoding="utf-8"))  # noqa: E731
    if read("model.json") != model:
        return "model.json does not read back as written"
    for variant, entry in model["variants"].items():
        names = [*entry["graphs"].values(), entry["weights"]]
        if sum((site / f).stat().st_size for f in names if f and (site / f).is_file()) != entry["bytes"]:
            return f"the {variant} graphs are not all there at the size model.json gives"
    shipped = {f.name: f.read_bytes() for f in SITE.iterdir()} | {f"vendor/{f}": (ORT_DIST / f).read_bytes() for f in ORT_FILES}
    shipped |= {f"vendor/{name}": (TOKENIZERS_DIST / f).read_bytes() for name, f in vendored_tokenizers(model).items()}
    shipped |= {f"vendor/{name}": (SENTENCEX_DIST / f).read_bytes() for name, f in SENTENCEX_FILES.items()}
    differ = sorted(name for name, data in shipped.items() if not (site / name).is_file() or (site / name).read_bytes() != data)
    if differ:
        return f"{differ[0]} is not the shipped file"
    entry = model["tokenizer"]
    if entry["kind"] == "sentencepiece":
        return None if read(entry["file"]) == tokenizer_json(m.translation_tokenizer()) else "tokenizer.json is not the directory's tokenizer"
    return site_tokenizer_problem(m, read(entry["file"]), entry)


def _next_step(source: Path, site: Path) -> str:
    sizes = ", ".join(f"{v} {n / 2**20:,.1f} MiB" for v, n in downloads(site).items())
    webgpu = downloads(site, "webgpu")["fp32"] / 2**20
    return (f"download per page load (runtime, tokenizer and one variant's graphs): {sizes} (index.html?variant=int8); "
            f"on WebGPU, where the browser offers it, fp32 {webgpu:,.1f} MiB (index.html?device=webgpu); "
            f"serve it with any static file server, e.g. python -m http.server -d {site}")


# `tk export DIR --web SITE`. With --force, a site's entries are replaced and anything else there (.git, CNAME) kept.
WRITER = Writer("web", lands=NewDirectory(owned=lambda site, m: site_entries(site, m, site_model(m)), what="a tk web site (no model.json)",
                                          keep_foreign=True),
                validate=_check, write=_write, verify=_verify, as_is="writes a site from the directory as it is", next_step=_next_step)


def site_entries(site: Path, m: manifest_mod.Manifest, model: dict) -> set[str] | None:
    """What --force replaces in an existing directory: the entries a tk site holds (those the old model.json names and
    those this site writes); None for a directory that is no tk site. Anything else there (.git, CNAME) is kept."""
    try:
        old = json.loads((site / "model.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(old, dict):
        return None
    names = {"model.json", "vendor", *(f.name for f in SITE.iterdir()), *(e.file for e in m.extra_files)}
    for record in (model, old):
        tokenizer = record.get("tokenizer")
        names.add(str(tokenizer.get("file") if isinstance(tokenizer, dict) else tokenizer))
        for entry in (record.get("variants") or {}).values():
            if isinstance(entry, dict):
                names.update(str(f) for f in [*(entry.get("graphs") or {}).values(), entry.get("weights")] if f)
    return {Path(n).parts[0] for n in names if n and Path(n).parts}


def downloads(site: Path, device: str = "wasm") -> dict[str, int]:
    """Bytes a page load on `device` (ORT_BUILDS) fetches, per variant: that device's runtime, the page, the tokenizer
    and that variant's graphs."""
    model = json.loads((site / "model.json").read_text(encoding="utf-8"))
    tokenizer = model["tokenizer"]["file"] if isinstance(model["tokenizer"], dict) else model["tokenizer"]
    # the sentence splitter, and the tokenizer library if any
    vendored = [*(p for p in (site / "vendor").glob("*.*js") if p.name not in ORT_FILES), site / "vendor" / "sentencex_wasm_bg.wasm"]
    runtime = [site / "vendor" / f for f in ORT_BUILDS[device]]
    shared = sum(p.stat().st_size for p in [*site.glob("*.mjs"), site / "index.html", site / "model.json", site / tokenizer,
                                            *vendored, *runtime])
    return {v: shared + entry["bytes"] for v, entry in model["variants"].items()}

