"""The benchmarks: `tk bench` (backends.py: every backend side by side; text.py: `--text`, tk's API against
CTranslate2, text in and text out) and every GPU measurement in one run (cuda_matrix.py). `tk bench --serve`'s
load test is toolkit/serve/load.py. Above the deploy path: they time the PyTorch side too, and nothing imports them
but the command line."""
