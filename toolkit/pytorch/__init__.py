"""The PyTorch side: the model registry, training, checkpoints, export to ONNX, the PyTorch reference and
step backend, and the measurements that compare PyTorch with the runtimes (bench, the GPU matrix)."""
