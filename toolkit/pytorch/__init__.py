"""The PyTorch side: the model registry, training, checkpoints, export to ONNX, and the PyTorch reference and its
step backend (`tk translate --backend torch` hands it to toolkit.deploy.translate.open_model). Never imported by
core, graphs, runtimes or deploy."""
