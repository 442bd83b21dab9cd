"""The benchmarks: `tk bench` (backends.py: every backend side by side; text.py: `--text`, tk's API against
CTranslate2, text in and text out; serve_load.py: `--serve`, a load test of `tk serve`) and every GPU measurement
in one run (cuda_matrix.py). Above the deploy path: they time the PyTorch side too, and nothing imports them
but the command line."""
