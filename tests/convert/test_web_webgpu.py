"""tk export --web on WebGPU: where the browser offers an adapter (headless Chromium with --enable-unsafe-webgpu gives
SwiftShader's, a CPU-emulated GPU), ?device=webgpu runs the fp32 graphs on onnxruntime-web's WebGPU build with the
WebAssembly page's greedy and beam-4 tokens and its first-step log-probabilities within the fp32 tolerance, and refuses
int8 in one line; a browser that offers none says so on the page and translates on WebAssembly. Each page fetches only
its own device's runtime."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from test_web import SHIPPED, TIMED, options, static_server

from toolkit.core.textprep import TextOptions
from toolkit.core.variants import CATALOGUE
from toolkit.deploy.translate import open_model, translate_batch
from toolkit.verify.compare import compare

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                                                   reason="no Chromium installed: apt-get install -y chromium (README, Web)")]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ADAPTER = "async () => { const a = await navigator.gpu?.requestAdapter(); return a ? a.info.architecture || a.info.vendor || 'unnamed' : null; }"
# Few and short: SwiftShader emulates the GPU on the CPU, a decoder step taking about a second.
SENTENCES = ["I'm home.", "Where is the station?", "It's raining.", "Tom is reading a book."]
WEBGPU_BUILD, WASM_BUILD = "asyncify", "ort-wasm-simd-threaded.wasm"  # names in each build's binary only


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The shipped model's site, as `tk export --web` writes it (built once, outside the tests' time limits)."""
    from web_import_fixture import shipped_site

    return shipped_site(tmp_path_factory)


def open_page(browser, url: str) -> tuple[object, list[str], list[str]]:
    """A page at `url`, the page errors it raises and the addresses it fetches."""
    page = browser.new_page()
    errors, fetched = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: fetched.append(r.url))
    page.goto(url)
    return page, errors, fetched


def test_webgpu_gives_the_webassembly_page_s_tokens_and_refuses_int8(site):
    from playwright.sync_api import sync_playwright

    with static_server(site) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--enable-unsafe-webgpu"])
        try:
            wasm, errors, fetched = open_page(browser, url)
            adapter = wasm.evaluate(ADAPTER)
            if adapter is None:
                pytest.skip("this Chromium offers no WebGPU adapter, even with --enable-unsafe-webgpu")
            assert wasm.evaluate("tk.ready")["device"] == "wasm"
            ids = wasm.evaluate("texts => tk.encode(texts)", SENTENCES)
            ref_first = np.array(wasm.evaluate("ids => tk.firstStep(ids)", ids), dtype=np.float32)
            ref_greedy = wasm.evaluate(TIMED, [ids, {"batchSize": 8}])
            ref_beam = wasm.evaluate(TIMED, [ids[:2], {"batchSize": 8, "beam": 4}])
            assert not [u for u in fetched if WEBGPU_BUILD in u]  # WebGPU's runtime is not fetched unless chosen

            gpu, errors, fetched = open_page(browser, url + "?device=webgpu")
            ready = gpu.evaluate("tk.ready")
            assert ready["device"] == "webgpu" and ready["fallback"] is None, ready
            assert gpu.inner_text("#model").endswith("on WebGPU") and gpu.inner_text("#status").startswith("ready in")
            first = np.array(gpu.evaluate("ids => tk.firstStep(ids)", ids), dtype=np.float32)
            stats = compare(ref_first, first, *CATALOGUE["fp32"].tolerance)
            assert stats["ok"], stats
            greedy = gpu.evaluate(TIMED, [ids, {"batchSize": 8}])
            assert greedy["tokens"] == ref_greedy["tokens"]
            beam = gpu.evaluate(TIMED, [ids[:2], {"batchSize": 8, "beam": 4}])
            assert beam["tokens"] == ref_beam["tokens"]
            assert beam["scores"] == pytest.approx(ref_beam["scores"], abs=1e-3)
            assert not [u for u in fetched if u.endswith(WASM_BUILD)] and not errors, errors

            int8, errors, _ = open_page(browser, url + "?device=webgpu&variant=int8")
            int8.wait_for_function("document.getElementById('status').textContent.startsWith('error')")
            assert int8.inner_text("#status") == "error: the int8 graphs do not run on WebGPU; choose fp32 graphs or WebAssembly"
        finally:
            browser.close()
    print(f"\nWebGPU on {adapter}: page ready in {ready['loadMs']:.0f} ms; first-step log-probs max abs "
          f"difference {stats['max_abs']:.2e} from WebAssembly's; greedy {len(ids)} sentences in {greedy['ms']:.0f} ms "
          f"(WebAssembly {ref_greedy['ms']:.0f} ms), beam 4 on 2 in {beam['ms']:.0f} ms (WebAssembly {ref_beam['ms']:.0f} ms)")


def test_a_browser_without_webgpu_says_so_and_translates_on_webassembly(site):
    from playwright.sync_api import sync_playwright

    model = open_model(SHIPPED, "cpu")
    texts = [n[0].text for n in translate_batch(model, SENTENCES[:2], options(model.manifest), text=TextOptions(enabled=False))]

    with static_server(site) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-features=WebGPU"])
        try:
            page, errors, fetched = open_page(browser, url + "?device=webgpu")
            assert page.evaluate(ADAPTER) is None  # the browser really offers no WebGPU, or this test proves nothing
            ready = page.evaluate("tk.ready")
            assert ready["device"] == "wasm" and ready["fallback"] == "this browser offers no WebGPU: running on WebAssembly"
            assert page.inner_text("#status").endswith("(this browser offers no WebGPU: running on WebAssembly)")
            assert page.inner_text("#model").endswith("on WebAssembly, 1 thread(s)")
            assert page.eval_on_selector("#device option[value=webgpu]", "o => o.disabled")
            page.fill("#input", "\n".join(SENTENCES[:2]))
            page.select_option("#beam", "1")
            page.click("#translate")
            page.wait_for_function("document.getElementById('status').textContent.includes('sentences in')")
            assert page.inner_text("#status").endswith("(this browser offers no WebGPU: running on WebAssembly)")
            assert page.inner_text("#output").splitlines() == texts and not errors, errors  # ONNX Runtime CPU's
            assert not [u for u in fetched if WEBGPU_BUILD in u]
            status = page.inner_text("#status")
        finally:
            browser.close()
    print(f"\nwithout WebGPU, asked for it: {status}")
