"""tk: export attention models to ONNX, prove parity, and translate with the graphs alone."""

__version__ = "0.1.0"
