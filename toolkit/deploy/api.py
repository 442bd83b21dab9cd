"""The public Python API: translate with an exported model directory from your own code.

    from toolkit import Translator
    Translator("exported/transformer").translate(["Hello."], beam=4)

Torch-free, like `tk translate`, which calls the same functions: the same options give the same output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from toolkit.core.batching import GUARDED, DecodeOptions, default_batch_size, default_streams
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest
from toolkit.core.textprep import TextOptions
from toolkit.deploy.translate import Translation, open_model, translate_batch


def decode_options(m: Manifest, beam: int = 1, alpha: float = 0.6, n_best: int = 1, max_len: int | None = None,
                   batch_size: int | None = None, max_tokens: int | None = None, max_len_a: float | None = GUARDED["max_len_a"],
                   max_len_b: int = GUARDED["max_len_b"], loop_guard: bool = GUARDED["loop_guard"], streams: int | None = None,
                   provider: str = "cpu") -> DecodeOptions:
    """Decoding options as `tk translate` takes them: max_len is capped at the model's maximum, guards on by default,
    batch_size None: chosen for the beam and provider (batching.default_batch_size), streams None: one per core
    (batching.default_streams)."""
    if n_best > beam:
        raise UsageError(f"n_best must be between 1 and beam (got beam {beam}, n_best {n_best})")
    _at_least_one("streams", streams, "leave it out for one per core")
    _at_least_one("batch_size", batch_size, "leave it out for the default")
    return DecodeOptions(beam=beam, alpha=alpha, n_best=n_best, max_len=min(max_len or m.max_len, m.max_len),
                         batch_size=default_batch_size(beam, provider) if batch_size is None else batch_size,
                         max_tokens=max_tokens, max_src_len=m.max_len,
                         max_len_a=max_len_a, max_len_b=max_len_b, loop_guard=loop_guard, streams=default_streams() if streams is None else streams)


def _at_least_one(name: str, value: object, fix: str) -> None:
    """A count given to the API is None (the default) or a whole number of at least 1, else a one-line error."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UsageError(f"{name} must be a whole number of at least 1 (got {value!r}); {fix}")


class Translator:
    """An exported translation model loaded on ONNX Runtime (provider None: CUDA if it truly loads, else CPU;
    variant None: the fastest graphs with fp32's output there, the attention-fused "optimized" ones on CPU)."""

    def __init__(self, model_dir: str | Path, provider: str | None = None, variant: str | None = None, threads: int | None = None,
                 allow_cpu_fallback: bool = False) -> None:
        self.model_dir = Path(model_dir)
        self.loaded = open_model(model_dir, provider, variant, allow_cpu_fallback, threads)
        self.variant = self.loaded.variant
        self._backend = self.loaded.backend()

    @property
    def provider(self) -> str:
        """The ONNX Runtime provider the graphs run on: "cpu" or "cuda"."""
        return self.loaded.provider

    @property
    def manifest(self) -> Manifest:
        return self.loaded.manifest

    def translate_batch(self, texts: Sequence[str], beam: int = 1, n_best: int = 1, keep: Sequence[str] = (),
                        split: bool = True, raw: bool = False, strict: bool = False, **options) -> list[list[Translation]]:
        """The n-best translations (text, score, token counts) of each text, in input order.

        `options` are decode_options' (alpha, max_len, batch_size, max_tokens, max_len_a, max_len_b, loop_guard, streams);
        keep/split/raw/strict mean what `tk translate --keep/--no-split/--raw/--strict` mean.
        """
        if isinstance(texts, str):
            raise UsageError("translate takes a list of texts; wrap a single sentence in a list: [\"Hello.\"]")
        opts = decode_options(self.manifest, beam=beam, n_best=n_best, provider=self.provider, **options)
        return translate_batch(self.loaded, list(texts), opts, self._backend, strict=strict,
                               text=TextOptions(keep=tuple(keep), split=split, enabled=not raw))

    def translate(self, texts: Sequence[str], beam: int = 1, **options) -> list[str]:
        """The best translation of each text, in input order."""
        return [nbest[0].text for nbest in self.translate_batch(texts, beam=beam, **options)]
