"""What a glossary costs the browser page (`tk export --web`), beside what it costs `Translator.translate` in Python:
the same lines, the same glossary, in headless Chromium (Debian's, driven by Playwright), on the page's one
WebAssembly thread (as `python -m http.server` serves it) and in Python on one ONNX Runtime thread.

    python docs/measurements/glossary/page_time.py [--model exported/transformer] [--lines 2000] [--repeat 3]
        [--json OUT]

The lines are the Tatoeba Challenge test file's first --lines that hold a term of bench-terms.tsv (the glossary of
docs/glossary.md's `tk bench --glossary` row) and that the page handles (one sentence, no number, URL or capitals:
textprep.prepare gives one segment with its terms and nothing else to protect). Each way is timed in turns, median of
--repeat: the lines without the glossary and with it, greedy and beam 4; the outputs must be the page's and Python's
alike (checked: the run stops if they differ).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from toolkit.core import glossary, textprep  # noqa: E402

TERMS = REPO / "docs" / "measurements" / "glossary" / "bench-terms.tsv"
CHALLENGE = REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt"
TRANSLATE = "async ([texts, opts]) => { const t = performance.now(); const out = await tk.translate(texts, opts); " \
            "return [performance.now() - t, out.map((o) => o.text)]; }"


def handled_lines(n: int, terms: glossary.Glossary) -> list[str]:
    from toolkit.bench.text import read_text

    out = []
    for line in read_text(CHALLENGE)[0][:n]:
        segments = textprep.prepare(line, glossary=terms)
        if len(segments) == 1 and segments[0].forced and not segments[0].case and not segments[0].forced.spans:
            out.append(line)
    return out


def serve(root: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    p.add_argument("--lines", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    from click.testing import CliRunner
    from playwright.sync_api import sync_playwright

    from toolkit.cli import main as tk
    from toolkit.deploy.api import Translator

    mapping = dict(line.split("\t") for line in TERMS.read_text(encoding="utf-8").splitlines())
    lines = handled_lines(a.lines, glossary.from_mapping(mapping))
    python = Translator(a.model, provider="cpu", threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        done = CliRunner().invoke(tk, ["export", str(a.model), "--web", str(site)])
        if done.exit_code != 0:
            sys.exit(done.output)
        server = serve(site)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        rows = {}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
            page.wait_for_function("!document.getElementById('translate').disabled")
            for beam in (1, 4):
                ways = {"page, no glossary": {"beam": beam}, "page, glossary": {"beam": beam, "glossary": mapping}}
                seconds: dict[str, list[float]] = {w: [] for w in [*ways, "python, no glossary", "python, glossary"]}
                texts: dict[str, list[str]] = {}
                for _ in range(a.repeat):
                    for way, opts in ways.items():
                        ms, texts[way] = page.evaluate(TRANSLATE, [lines, opts])
                        seconds[way].append(ms / 1000)
                    for way, terms in (("python, no glossary", None), ("python, glossary", mapping)):
                        start = time.perf_counter()
                        texts[way] = python.translate(lines, beam=beam, glossary=terms, streams=1)
                        seconds[way].append(time.perf_counter() - start)
                for kind in ("no glossary", "glossary"):
                    if texts[f"page, {kind}"] != texts[f"python, {kind}"]:
                        sys.exit(f"beam {beam}, {kind}: the page's translations differ from Python's")
                rows[f"beam {beam}"] = {w: round(statistics.median(s), 3) for w, s in seconds.items()}
                print(f"beam {beam}, {len(lines)} lines holding terms:",
                      ", ".join(f"{w} {s:.2f} s" for w, s in rows[f"beam {beam}"].items()), flush=True)
            browser.close()
        server.shutdown()
    result = {"lines": len(lines), "of": a.lines, "terms": len(mapping), "seconds": rows,
              "chromium": chromium, "python_threads": 1}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
