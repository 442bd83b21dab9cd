"""`tk translate-corpus`: a corpus split into shards, translated by a pool of Ray Data actors.

inputs.py (files, directories, globs, Parquet columns; reading one shard's lines), shards.py (the
plan and the shard manifest in OUTPUT_DIR), worker.py (the actor: ONNX Runtime sessions and
translate_batch), merge.py (the ordered output), progress.py, run.py (the driver). Torch-free;
ray and pyarrow come from the `ray` extra and are imported only here.
"""
