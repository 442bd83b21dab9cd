"""Peak resident memory of tk with and without the shortlist on a `tk bench --scale` model: a fresh process per run loads
the model as the bench's tk engine does (2 threads: two decoding streams of their own sessions, a spinning decoder for
one batch), decodes the real-sentence greedy row (the first 128 sentences of --sources, batches of 32, exactly --tokens
tokens each) and prints its resident memory after loading, its peak while loading and its peak (ru_maxrss), in MiB.

    python docs/measurements/shortlist_memory.py WORK/tk --sources ../shared/data/tatoeba-test-eng-fra.txt [--variant int8]

WORK is the bench's --work directory: its tk model holds the bench's synthetic shortlist (toolkit.bench.scale_shortlist).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys
from pathlib import Path
from toolkit.bench.scale import real_sources
from toolkit.bench.scale_worker import _Tk

model, variant, shortlist, sources, tokens = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5])
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
tk = _Tk(model, "cpu", variant, 2, tokens, shortlist=shortlist)
loaded, load_peak = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out = tk.run(real_sources(Path(sources), 128, Path(model)), 32, 1)
assert all(len(o) == tokens for o in out)
print(json.dumps({"loaded_mib": loaded, "load_peak_mib": load_peak, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--sources", required=True)
    p.add_argument("--variant", default="fp32", help="fp32 (the engine's default graphs) or int8")
    p.add_argument("--tokens", type=int, default=32)
    a = p.parse_args()
    for shortlist in (False, True):
        done = subprocess.run([sys.executable, "-c", CHILD, a.model, a.variant, str(int(shortlist)), a.sources, str(a.tokens)],
                              capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"tk {a.variant}{' with the shortlist' if shortlist else ''}: {r['loaded_mib']:,.0f} MiB loaded "
              f"(peak while loading {r['load_peak_mib']:,.0f} MiB), peak {r['peak_mib']:,.0f} MiB")


if __name__ == "__main__":
    main()
