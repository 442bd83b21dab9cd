"""One engine of `tk bench --scale`, in a process of its own: loads its model once, then decodes what the bench sends,
turn by turn, so each engine runs as a user would run it (alone in its process, its own thread pools) while the
engines still take turns (a slow spell of the machine hits each alike).

Protocol: one JSON object a line. First line in: {"engine", "model", "threads", "tokens"}; out: {"version",
"threads"} or {"error"}. Then each line in: {"src": [[ids]], "batch", "beam", "per_call"}; out: {"seconds",
"outputs": [[ids]]} and, for an engine timed more than one way, "how" (the faster way). CTranslate2's hello also
holds the CT2_USE_MKL it was started with (its CPU backend). A closed stdin ends it.
Everything libraries print goes to stderr.

Engines: tk-fp32 and tk-int8 (tk's runtime, its decoding loop: imports toolkit; fp32 is the float32 variant tk runs on
CPU by default: attention fused, or the exported graphs past 1.5 GB of weights, onnxruntime.runtime.default_variant),
ct2-fp32 and ct2-int8 (CTranslate2's translate_batch over its own conversion), transformers (AutoModelForSeq2SeqLM's
generate: Marian or M2M100) and optimum (ORTModelForSeq2SeqLM from Optimum's own exporter, at its defaults). Only tk's
engines import tk, so the peers run under any Python that has them (--peer-python). Each is told to decode exactly
`tokens` tokens per sentence; the model forbids its end token.

On a GPU: tk-cuda-fp32 and tk-cuda-fp16 (ONNX Runtime's CUDA provider: the exported graphs, and the fp16 variant),
ct2-cuda-fp32 and ct2-cuda-fp16 (CTranslate2 on device "cuda"), transformers-cuda and transformers-cuda-fp16 (the
model moved to the GPU, in float32 or half precision). Where CUDA cannot be used each says why in its one line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time

COMPUTE = {"fp32": "float32", "fp16": "float16", "int8": "int8"}  # CTranslate2's compute type for each precision


def parse(engine: str) -> tuple[str, str, str]:
    """An engine's name as (kind, device, precision): 'tk-int8' -> ('tk', 'cpu', 'int8'), 'transformers-cuda-fp16' ->
    ('transformers', 'cuda', 'fp16'); no precision named is float32."""
    kind, *rest = engine.split("-")
    device = "cuda" if "cuda" in rest else "cpu"
    precision = next((p for p in rest if p in ("fp32", "fp16", "int8")), "fp32")
    return kind, device, precision


class _Tk:
    def __init__(self, model: str, device: str, precision: str, threads: int, tokens: int, shortlist: bool = False):
        from toolkit.core import manifest
        from toolkit.runtimes import registry

        self.m = manifest.load(model)
        # fp32: the float32 graphs tk runs by default on the device (`tk translate`'s own choice), as the peers run theirs
        variant = registry.get(registry.DEFAULT).default_variant(device, self.m) if precision == "fp32" else precision
        self.streams = 1
        if device == "cuda":  # the provider's own threads; a missing CUDA provider is an error, never a CPU run
            self.loaded = registry.load(self.m, registry.DEFAULT, "cuda", variant, shortlist=shortlist)
            self.threads = "CUDA provider, 1 stream"
        else:
            # As `tk translate` runs on `threads` cores (batching.default_threads and default_request_threads): several
            # batches decode side by side, one stream per core (up to 4) on sessions of their own, and a call of one
            # batch decodes on every core, the decoder session's workers spinning between the steps of the call (on
            # one thread for a small model's int8 decoder).
            from toolkit.core.batching import one_request_thread
            from toolkit.runtimes.onnxruntime.runtime import weights_bytes

            self.streams = max(1, min(threads, 4))
            request = 1 if one_request_thread(variant, weights_bytes(self.m) // 4) else min(threads, 4)
            self.loaded = registry.load(self.m, registry.DEFAULT, "cpu", variant, threads=max(1, threads // self.streams),
                                        request_threads=request, shortlist=shortlist)
            on_one_call = f"{request} spinning decoder threads" if request > 1 else "1 decoder thread"
            self.threads = (f"{self.streams} streams x {max(1, threads // self.streams)} intra-op threads for several batches; "
                            f"{on_one_call} for a call of one batch")
        self.backend = self.loaded.backend()
        self.tokens = tokens
        self.version = registry.get(registry.DEFAULT).label() + f", tk {variant} on {device}"
        if device == "cpu":
            from toolkit.runtimes.onnxruntime import native

            self.version += f"; {native.status()}"

    def run(self, src: list[list[int]], batch: int, beam: int) -> list[list[int]]:
        from toolkit.core.batching import DecodeOptions, decode_ids

        # No language forced first, as the peers decode the bench's model (its generation config forces none; tk's
        # default would force the tokenizer's tgt_lang), so every engine takes the same steps.
        rules = dataclasses.replace(self.m.rules(), forced_first=None)
        opts = DecodeOptions.bare(beam=beam, batch_size=batch, max_len=self.tokens, streams=self.streams, rules=rules)
        return [h[0].tokens for h in decode_ids(self.backend, src, opts)]


class _Ct2:
    def __init__(self, model: str, device: str, compute_type: str, threads: int, tokens: int, pause: float, vmap: bool = False):
        import ctranslate2

        from toolkit.runtimes.ctranslate2.engine import gemm_backends

        self.pause, self.vmap = pause, vmap  # vmap: its vocabulary map (vmap.txt in the model, scale_shortlist)
        self.use_mkl = os.environ.get("CT2_USE_MKL")  # its backend, as the bench set it (read once, at the first load)
        # Its two ways of using the cores, each row timed with both and the faster kept (its best threads): one batch
        # at a time on every core (intra_threads), or batches side by side, one core each (inter_threads).
        ways = [(threads, 1)] + ([(1, threads)] if device == "cpu" and threads > 1 else [])
        self.translators = {f"intra_threads {i} x inter_threads {j}": ctranslate2.Translator(
            model, device=device, compute_type=compute_type, intra_threads=i, inter_threads=j) for i, j in ways}
        with open(os.path.join(model, "shared_vocabulary.json"), encoding="utf-8") as f:
            self.pieces = json.load(f)
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        self.tokens = tokens
        # The matrix products it runs here (MKL or oneDNN, chosen per process from CT2_USE_MKL and the CPU's vendor).
        backends = gemm_backends(model, compute_type) if device == "cpu" else ""
        self.version = f"ctranslate2 {ctranslate2.__version__} {compute_type} on {device}" + (f" ({backends})" if backends else "")
        self.threads = " or ".join(self.translators) + (", the faster per row" if len(self.translators) > 1 else "")

    def run(self, src: list[list[int]], batch: int, beam: int, translator=None) -> list[list[int]]:
        # min = max decoding length: exactly `tokens` tokens (the end token is excluded from the output).
        translator = translator or next(iter(self.translators.values()))
        results = translator.translate_batch([[self.pieces[t] for t in s] for s in src], max_batch_size=batch,
                                             batch_type="examples", beam_size=beam, min_decoding_length=self.tokens,
                                             max_decoding_length=self.tokens, length_penalty=1.0, use_vmap=self.vmap)
        return [[self.ids[p] for p in r.hypotheses[0]] for r in results]

    def timed(self, src: list[list[int]], batch: int, beam: int, per_call: bool) -> dict:
        """Each way timed on the row in turn; the faster's seconds, and which it was."""
        best = None
        for how, translator in self.translators.items():
            got = timed_row(functools.partial(self.run, translator=translator), src, batch, beam, per_call)
            if best is None or got["seconds"] < best["seconds"]:
                best = {**got, "how": how}
            time.sleep(self.pause)  # the spinning threads of one way idle before the other's run
        return best


class _Generate:
    """transformers' or Optimum's generate over the Hugging Face directory (Optimum: its export cached in the work dir)."""

    def __init__(self, engine: str, model: str, threads: int, tokens: int, work: str | None):
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        kind, self.device, precision = parse(engine)
        if kind == "transformers":
            import transformers
            from transformers import AutoModelForSeq2SeqLM

            if self.device == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
            self.model = AutoModelForSeq2SeqLM.from_pretrained(model).eval().to(self.device)
            if precision == "fp16":
                self.model = self.model.half()
            self.version = f"transformers {transformers.__version__}, torch {torch.__version__}, {precision} on {self.device}"
        else:
            import onnxruntime
            import optimum.version
            from optimum.onnxruntime import ORTModelForSeq2SeqLM

            exported = os.path.join(work or model, "optimum")
            if not os.path.isdir(exported):  # Optimum's exporter at its defaults, kept for the next run
                ORTModelForSeq2SeqLM.from_pretrained(model, export=True).save_pretrained(exported)
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            self.model = ORTModelForSeq2SeqLM.from_pretrained(exported, session_options=options)
            self.version = f"optimum {optimum.version.__version__}, onnxruntime {onnxruntime.__version__}"
        self.threads = f"{threads} intra-op threads" if kind == "optimum" else f"torch {threads} threads" if self.device == "cpu" else "CUDA"
        self.pad, self.tokens = self.model.config.pad_token_id, tokens

    def run(self, src: list[list[int]], batch: int, beam: int) -> list[list[int]]:
        out = []
        with self.torch.inference_mode():
            for i in range(0, len(src), batch):
                rows = src[i : i + batch]
                width = max(map(len, rows))
                ids = self.torch.tensor([r + [self.pad] * (width - len(r)) for r in rows], device=self.device)
                mask = self.torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device)
                generated = self.model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                                max_new_tokens=self.tokens, min_new_tokens=self.tokens,
                                                forced_eos_token_id=None, num_return_sequences=1)
                out += [row[1:] for row in generated.tolist()]  # the start token dropped
        return out


def load(request: dict):
    engine, model, threads, tokens = request["engine"], request["model"], request["threads"], request["tokens"]
    kind, device, precision = parse(engine)
    if kind == "tk":
        return _Tk(model, device, precision, threads, tokens, shortlist=engine.endswith("-shortlist"))
    if kind == "ct2":
        return _Ct2(model, device, COMPUTE[precision], threads, tokens,
                    request["pause"], vmap=engine.endswith("-vmap"))  # pause: the driver's (scale.PAUSE_S, or a test's)
    return _Generate(engine, model, threads, tokens, request.get("work"))


def timed_row(run, src: list[list[int]], batch: int, beam: int, per_call: bool) -> dict:
    """One row decoded by `run(src, batch, beam)`: in batches, or one sentence per call; its seconds and outputs."""
    start = time.perf_counter()
    outputs = [o for s in src for o in run([s], 1, beam)] if per_call else run(src, batch, beam)
    return {"seconds": time.perf_counter() - start, "outputs": outputs}


def serve(engine, read, write) -> None:
    for line in read:
        job = json.loads(line)
        src, batch, beam, per_call = job["src"], job["batch"], job["beam"], job["per_call"]
        # An engine timed more than one way (CTranslate2's threads) says which way was faster.
        write(engine.timed(src, batch, beam, per_call) if hasattr(engine, "timed") else timed_row(engine.run, src, batch, beam, per_call))


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the protocol

    def write(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    request = json.loads(sys.stdin.readline())
    try:
        engine = load(request)
    except ModuleNotFoundError as e:
        write({"error": f"{e.name} is not installed for {sys.executable}"})
        return
    except Exception as e:  # noqa: BLE001 - reported as the engine's one line; the other engines' rows go on
        write({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        return
    write({"version": engine.version, "threads": engine.threads, **({"CT2_USE_MKL": engine.use_mkl} if isinstance(engine, _Ct2) else {})})
    serve(engine, sys.stdin, write)


if __name__ == "__main__":
    main()
