"""tk: export attention models to ONNX, prove parity, and translate with the graphs alone.

The public API: `from toolkit import Translator` (see toolkit.deploy.api). Loaded on first use, so that
`import toolkit` (and `tk --help`) stays instant.
"""

__version__ = "0.1.0"
__all__ = ["SpanRepairWarning", "Translator", "__version__"]


def __getattr__(name: str):
    if name in ("Translator", "SpanRepairWarning"):
        from toolkit.deploy import api

        return getattr(api, name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
