"""Where an fp32 model directory's session memory goes: the peak resident memory of a fresh process that creates the
encoder and decoder sessions of `DIR`, with ONNX Runtime's defaults and with prepacking off, each in a process of its
own.

    python docs/measurements/session_memory.py DIR [--variant fp32]

`session.disable_prepacking`: ONNX Runtime keeps, beside each MatMul/Gemm weight, a copy packed for its kernels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import onnxruntime as ort
from toolkit.core import manifest
from toolkit.graphs.variants import graph_source
m = manifest.load(sys.argv[1])
config = json.loads(sys.argv[3])
start = time.perf_counter()
sessions = {}
for name in ("encoder", "decoder"):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    source, _ = graph_source(m, name, sys.argv[2])
    sessions[name] = ort.InferenceSession(source if isinstance(source, bytes) else str(source), options,
                                          providers=["CPUExecutionProvider"])
ready = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"ready_s": round(ready, 1), "peak_gib": round(peak, 2)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--variant", default="fp32")
    args = parser.parse_args()
    for label, config in (("defaults", {}), ("session.disable_prepacking=1", {"session.disable_prepacking": "1"})):
        done = subprocess.run([sys.executable, "-c", CHILD, args.directory, args.variant, json.dumps(config)],
                              capture_output=True, text=True, check=True)
        print(f"{label}: {done.stdout.strip()}")


if __name__ == "__main__":
    main()
