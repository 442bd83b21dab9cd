"""tk: export attention models to ONNX, prove parity, and translate with the graphs alone.

The public API: `from toolkit import Translator` (see toolkit.deploy.api), and on the build side (torch) `from toolkit
import Seq2SeqAdapter, export_model` for your own PyTorch model (see toolkit.pytorch.adapter). Loaded on first use, so
that `import toolkit` (and `tk --help`) stays instant, and the deploy side never imports torch.
"""

__version__ = "0.1.0"
__all__ = ["Seq2SeqAdapter", "SpanRepairWarning", "Translator", "WordVocab", "__version__", "export_model"]


def __getattr__(name: str):
    if name in ("Translator", "SpanRepairWarning"):
        from toolkit.deploy import api

        return getattr(api, name)
    if name == "Seq2SeqAdapter":
        from toolkit.pytorch.adapter import Seq2SeqAdapter

        return Seq2SeqAdapter
    if name == "WordVocab":  # torch-free: an adapter's word-level vocabulary
        from toolkit.core.word_vocab import WordVocab

        return WordVocab
    if name == "export_model":
        from toolkit.pytorch.export import export_model

        return export_model
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
