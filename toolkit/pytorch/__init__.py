"""The PyTorch side: the model registry, training, checkpoints, export to ONNX, and the PyTorch reference and its
step backend (registered as the "torch" backend of toolkit.runtimes.load when imported). Never imported by core,
runtimes or deploy."""
