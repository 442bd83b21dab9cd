"""`tk export --quantize int8 --keep-fp32 auto`: int8 that keeps the layers quantisation hurts most in float,
as few as needed for `tk verify --variant int8` to pass and greedy BLEU on held-out sentences to stay within
a budget of fp32's.

The layers are ranked once (toolkit.verify.int8_layers: each quantised alone, its error in the log-probabilities);
then plain int8 is tried, then int8 with the worst layer in float, the two worst, and so on. Each candidate
is written into a scratch copy of the directory and judged there, so the directory itself is only written
with the graphs that passed: the write's check holds the graphs stored to the digests of the ones judged.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from toolkit.convert.pipeline import IntoModelDirectory, Writer
from toolkit.core import manifest, variants
from toolkit.graphs.variants import int8_graph

BLEU_SENTENCES = 1000  # judging a candidate


def graphs_with(directory: Path, out: Path, keep_fp32: dict[str, list[str]]) -> dict:
    """Writes the int8 graphs of `directory`'s fp32 graphs into `out`, keeping the named layers in float;
    returns manifest file records by graph name."""
    import onnx

    m = manifest.load(directory)
    made = {}
    for name in m.graphs:
        with tempfile.TemporaryDirectory(prefix="tk-int8-") as tmp:
            whole = Path(tmp) / "graph.onnx"
            onnx.save_model(onnx.load(str(m.graph_path(name))), whole)
            dst = out / f"{name}{variants.CATALOGUE['int8'].suffix}.onnx"
            int8_graph(whole, dst, keep_fp32=keep_fp32.get(name, []))
        made[name] = {"file": dst.name, "sha256": manifest.file_sha256(dst), "bytes": dst.stat().st_size}
    return made


def greedy_bleu(directory: Path, variant: str, english: list[str], references: list[list[str]]) -> float:
    """BLEU of tk translate's greedy output (guards on), as a user gets it."""
    from toolkit.core.scoring import bleu_chrf
    from toolkit.deploy.api import Translator

    out = Translator(directory, provider="cpu", variant=variant).translate(english)
    return float(bleu_chrf(out, references)["bleu"])


def choose(directory: Path, budget: float, data=None, echo: Callable[[str], None] = print) -> tuple[dict[str, list[str]], list, dict]:
    """The layers to keep in float per graph, the layer table they were chosen from, and the sha256 of each graph of
    the int8 variant judged last (the one chosen, or the last tried when none passed: every layer kept), by graph."""
    from toolkit.core import data as data_mod
    from toolkit.verify import int8_layers
    from toolkit.verify.run import verify

    corpus = data_mod.load_corpus(data, download=False)
    english, refs = data_mod.references(corpus.splits["test"])
    english, refs = english[:BLEU_SENTENCES], refs[:BLEU_SENTENCES]
    m = manifest.load(directory)
    echo(f"ranking the int8 layers on {int8_layers.PROBE} held-out sentences ...")
    table = int8_layers.layer_table(m, english[:int8_layers.PROBE])
    with tempfile.TemporaryDirectory(prefix="tk-keep-fp32-") as tmp:
        scratch = Path(tmp) / directory.name
        shutil.copytree(directory, scratch)
        fp32_bleu = greedy_bleu(scratch, "fp32", english, refs)

        def accept(plan: dict[str, list[str]]) -> bool:
            sm = manifest.load(scratch)
            sm.stored["int8"] = manifest.VariantRecord(
                graphs={g: manifest.FileRecord(**f) for g, f in graphs_with(scratch, scratch, plan).items()},
                **variants.CATALOGUE["int8"].record())
            sm.save()
            report = verify(scratch, variants=["int8"], echo=lambda s: None, localize=False, data=data)
            bleu = greedy_bleu(scratch, "int8", english, refs)
            echo(f"  verify: {len(report.rows) - len(report.failures)}/{len(report.rows)} checks passed; greedy BLEU on "
                 f"{len(english)} held-out sentences {bleu:.2f} against fp32's {fp32_bleu:.2f} (budget {budget:g})")
            return not report.failures and fp32_bleu - bleu <= budget

        plan = int8_layers.auto_keep(table, accept, echo)
        judged = {g: f.sha256 for g, f in manifest.load(scratch).stored["int8"].graphs.items()}
    return plan, table, judged


def describe(plan: dict[str, list[str]], table: list) -> str:
    """What a stored variant's manifest note says of the layers kept in float."""
    kept = [r.module for r in table if r.node in plan.get(r.graph, [])]
    return f"; layers kept in float (--keep-fp32 auto): {', '.join(kept)}" if kept else "; every layer int8 (--keep-fp32 auto kept none)"


def writer(bleu_within: float) -> Writer:
    """The guarded int8 variant's writer, stored as `tk export DIR --quantize int8` stores the plain one: the layers are
    chosen (on scratch copies) as it writes."""
    def write(m: manifest.Manifest, tmp: Path, echo: Callable[[str], None]) -> tuple[dict, str, dict]:
        plan, table, judged = choose(m.directory, bleu_within, echo=echo)
        return graphs_with(m.directory, tmp, plan), describe(plan, table), judged

    def record(m: manifest.Manifest, written: tuple[dict, str, dict], files: dict[str, manifest.FileRecord], command: str | None) -> None:
        made, kept, _ = written
        entry = variants.CATALOGUE["int8"].record()
        entry["note"] += kept
        m.stored["int8"] = manifest.VariantRecord(graphs={g: files[f["file"]] for g, f in made.items()}, **entry, command=command)

    return Writer("keep-fp32", lands=IntoModelDirectory(what="the int8 variant", stage="tk-variants", again="rebuild it", record=record,
                                                        replaces=lambda m: "the int8 variant" if "int8" in m.stored else None),
                  write=write, verify=judged_graphs)


def judged_graphs(m: manifest.Manifest, tmp: Path, written: tuple[dict, str, dict]) -> str | None:
    """verify: the int8 graphs stored are, byte for byte, the ones verify and the BLEU budget judged (the int8 builder
    is deterministic: the same fp32 graph and layers give the same file)."""
    made, _, judged = written
    differ = [f["file"] for g, f in made.items() if manifest.file_sha256(tmp / f["file"]) != judged.get(g)]
    return f"{differ[0]} is not the graph that was judged" if differ else None
