"""The Hugging Face peers of `tk bench --text`, run as a script of their own: transformers' `generate` (PyTorch) and
Optimum's `ORTModelForSeq2SeqLM` (exported by Optimum's own exporter, at its defaults), each over the MarianMTModel
directory `tk export DIR --to-hf` writes, with that directory's tokenizer and generation config.

It imports nothing of tk, so it runs under any Python that has the peers installed (`tk bench --peer-python`): Optimum
pins an older transformers than tk's `hf` extra, so the two usually live in different environments. Request on stdin,
results on stdout, both JSON:
  in   {"hf_dir", "sources", "beams", "requests", "repeat", "engines": ["transformers", "optimum"], "batch"}
  out  {"ENGINE": {"version", "threads", "file": {"BEAM": {"seconds": [...], "outputs": [...]}},
                   "requests": {"seconds": [...]}}} or {"ENGINE": {"error": "one line"}}
"""

from __future__ import annotations

import json
import sys
import tempfile
import time


def _load(engine: str, hf_dir: str, work: str):
    if engine == "transformers":
        import transformers
        from transformers import MarianMTModel

        return MarianMTModel.from_pretrained(hf_dir).eval(), f"transformers {transformers.__version__}"
    import optimum.version
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    model = ORTModelForSeq2SeqLM.from_pretrained(hf_dir, export=True)  # Optimum's exporter, its defaults
    model.save_pretrained(work)  # what a user deploys: reloaded from the exported files, as in production
    return ORTModelForSeq2SeqLM.from_pretrained(work), f"optimum {optimum.version.__version__}"


def _translate(model, tokenizer, lines: list[str], beam: int, batch: int) -> list[str]:
    """Batches of similar length (as tk batches), outputs back in input order."""
    import torch

    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    out = [""] * len(lines)
    with torch.inference_mode():
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            # Cut to the model's positions, as tk cuts its sources (the tokenizer's model_max_length).
            inputs = tokenizer([lines[i] for i in idx], return_tensors="pt", padding=True, truncation=True)
            generated = model.generate(**inputs, num_beams=beam, do_sample=False)
            for i, text in zip(idx, tokenizer.batch_decode(generated, skip_special_tokens=True)):
                out[i] = text
    return out


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def measure(engine: str, request: dict) -> dict:
    import torch
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix=f"tk-{engine}-") as work:
        model, version = _load(engine, request["hf_dir"], work)
        tokenizer = AutoTokenizer.from_pretrained(request["hf_dir"])
        sources, batch = request["sources"], request["batch"]
        _translate(model, tokenizer, sources[:8], 1, batch)  # first-call allocations, as tk's own warm-up
        result = {"version": version, "threads": torch.get_num_threads(), "file": {}, "requests": {"seconds": []}}
        asked = sources[: request["requests"]]
        for _ in range(request["repeat"]):
            for beam in request["beams"]:
                seconds, outputs = _timed(lambda b=beam: _translate(model, tokenizer, sources, b, batch))
                row = result["file"].setdefault(str(beam), {"seconds": []})
                row["seconds"].append(seconds)
                row["outputs"] = outputs
            seconds, _ = _timed(lambda: [_translate(model, tokenizer, [s], 1, 1) for s in asked])
            result["requests"]["seconds"].append(seconds / max(1, len(asked)))
        return result


def main() -> None:
    request = json.load(sys.stdin)
    results = {}
    for engine in request["engines"]:
        try:
            results[engine] = measure(engine, request)
        except ModuleNotFoundError as e:
            results[engine] = {"error": f"{e.name} is not installed for {sys.executable}"}
        except ImportError as e:  # installed, but not with the transformers beside it (Optimum pins an older one)
            results[engine] = {"error": f"cannot import it with {sys.executable}: {str(e).splitlines()[0]}"}
        except Exception as e:  # noqa: BLE001 - one peer failing must not lose the others' rows
            results[engine] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
