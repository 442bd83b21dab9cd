"""A held-out check of the imports: small models of each imported architecture that no test uses (another seed, other
training sentences, more steps than the tests' fixtures), each through `tk export hf:DIR --out OUT` and `tk verify OUT
--checkpoint hf:DIR`, then `Translator(OUT).translate(texts, beam=b, raw=True, loop_guard=False, max_len_a=None)` against
transformers' `generate` on 200 held-out Tatoeba sentences, greedy and beam 4: the share of identical outputs among
those that `generate` ends before the length limit.

    python docs/measurements/unseen_models.py [--only t5,m2m100,...] [--work DIR] [--provider cuda]

Run it under each transformers line (the `hf` extra's 5.x, and 4.57 beside Optimum); the builders are the tests'
(tests/), called with seed 7 and sentences 2,000 to 2,400 of fra-eng.zip (the tests train on the first 400 with seed 0).

On a GPU (`--provider cuda`): verify runs on CUDA with the fp32 and fp16 variants (T5's fp16 is refused: the refusal's
line is recorded), and tk translates on CUDA with each; `generate` stays on the CPU, the reference. A --work directory
that already holds the models and their held-out sentences (held_out.json) is reused as it is: the models can be
built and exported on one machine and carried to a GPU machine without fra-eng.zip.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "pytorch")]

SEED, TRAIN, HELD_OUT = 7, slice(2000, 2400), slice(3000, 3200)


def _architectures():
    """name -> (build(path, pairs), tk's language arguments, generate(hf, english, beam) -> (texts, ended))."""
    import torch
    from hf_marian_fixture import marian_directory
    from hf_seq2seq_fixture import m2m100_directory, nllb_directory
    from test_hf_mbart import _generate as mbart_generate
    from test_hf_mbart import mbart_directory
    from test_hf_t5 import PREFIX, t5_directory

    def generate(hf: Path, sources: list[str], beam: int, tokenizer=None, skip: int = 1, **how):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        tokenizer = tokenizer or AutoTokenizer.from_pretrained(hf)
        model = AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
        with torch.inference_mode():
            out = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=beam, do_sample=False, **how)
        out = out[:, skip:]
        ended = [bool((row == tokenizer.eos_token_id).any()) for row in out]
        return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)], ended

    def m2m100_generate(hf, english, beam):
        from transformers import M2M100Tokenizer

        tokenizer = M2M100Tokenizer.from_pretrained(hf, src_lang="en")
        return generate(hf, english, beam, tokenizer, 2, forced_bos_token_id=tokenizer.get_lang_id("fr"))

    def nllb_generate(hf, english, beam):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(hf, src_lang="eng_Latn")
        return generate(hf, english, beam, tokenizer, 2, forced_bos_token_id=tokenizer.convert_tokens_to_ids("fra_Latn"))

    import transformers

    languages = {"source_lang": "en", "target_lang": "fr"}
    # transformers 4.x builds an unshared Marian decoder embedding of vocab_size rows, not decoder_vocab_size: the two
    # vocabularies must be of one size there (as the Hub's tc-big models' are).
    four = int(transformers.__version__.split(".")[0]) < 5
    pieces = (300, 300) if four else (280, 320)
    table = {
        "marian (tc-big: two vocabularies, untied)": (
            lambda p, pairs: marian_directory(p, pairs, separate=True, activation="relu", seed=SEED, steps=120,
                                             pieces=pieces), {},
            lambda hf, e, b: generate(hf, e, b)),
        "m2m100": (lambda p, pairs: m2m100_directory(p, pairs, seed=SEED, steps=400), languages, m2m100_generate),
        "mbart-50": (lambda p, pairs: mbart_directory(p, pairs, "mbart50", seed=SEED, steps=200), languages,
                     lambda hf, e, b: mbart_generate("mbart50", hf, e, b)),
        "mbart-cc25": (lambda p, pairs: mbart_directory(p, pairs, "cc25", seed=SEED, steps=200), languages,
                       lambda hf, e, b: mbart_generate("cc25", hf, e, b)),
        "t5 (task prefix)": (lambda p, pairs: t5_directory(p, pairs, mt5=False, seed=SEED, steps=200), languages,
                             lambda hf, e, b: generate(hf, [PREFIX + s for s in e], b)),
        "mt5 (gated-gelu, untied)": (lambda p, pairs: t5_directory(p, pairs, mt5=True, seed=SEED, steps=200), {},
                                     lambda hf, e, b: generate(hf, e, b)),
    }
    if not four:  # NllbTokenizer builds from pieces and merges in 5.x only
        table["nllb (tokenizer.json)"] = (lambda p, pairs: nllb_directory(p, pairs, seed=SEED, steps=160), languages,
                                          nllb_generate)
    return table


def main() -> None:
    import transformers
    from click.testing import CliRunner
    from hf_marian_fixture import fra_eng_lines

    from toolkit import Translator
    from toolkit.cli import main as tk

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tk-unseen-"))
    held_out = work / "held_out.json"
    if held_out.is_file():  # the models built (and their sentences chosen) by an earlier run
        pairs, english = None, json.loads(held_out.read_text(encoding="utf-8"))
    else:
        pairs = fra_eng_lines(REPO.parent / "shared" / "data" / "fra-eng.zip", 4000)
        english = [e for e, _ in pairs[HELD_OUT]]
        work.mkdir(parents=True, exist_ok=True)
        held_out.write_text(json.dumps(english, ensure_ascii=False), encoding="utf-8")
    # On CUDA both of its variants: the float32 graphs and fp16 (verify's own tolerance for it).
    variants = ("fp32", "fp16") if args.provider == "cuda" else ("fp32",)
    print(f"transformers {transformers.__version__}; {len(english)} held-out sentences; work {work}; tk on {args.provider}")
    print("| architecture | variant | verify | greedy identical (ended) | beam 4 identical (ended) |")
    print("| --- | --- | --- | --- | --- |")
    results = {}
    for name, (build, langs, generate) in _architectures().items():
        if args.only and not any(key in name for key in args.only.split(",")):
            continue
        root = work / name.split()[0]
        start = time.perf_counter()
        if not (root / "tk" / "manifest.json").is_file():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                build(root / "hf", pairs[TRAIN])
            exported = CliRunner().invoke(tk, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
            assert exported.exit_code == 0, exported.output
        wanted = {}
        for beam in (1, 4):
            try:
                wanted[beam] = generate(root / "hf", english, beam)
            except Exception as e:  # noqa: BLE001 - a transformers release that cannot run the reference: said in the row
                wanted[beam] = f"generate failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        for variant in variants:
            verified = CliRunner().invoke(tk, ["verify", str(root / "tk"), "--checkpoint", f"hf:{root / 'hf'}",
                                               "--provider", args.provider, "--variant", variant])
            last = (verified.output.strip().splitlines() or [""])[-1]
            row = [name, variant, f"exit {verified.exit_code}: {last[:90]}"]
            results[f"{name} {variant} verify"] = [verified.exit_code, last]
            if verified.exit_code == 2:  # refused (T5's fp16): nothing to translate with
                print("| " + " | ".join(row + ["", ""]) + " |", flush=True)
                continue
            try:
                translator = Translator(root / "tk", provider=args.provider, variant=variant)
                for beam in (1, 4):
                    if isinstance(wanted[beam], str):
                        row.append(wanted[beam])
                        continue
                    want, ended = wanted[beam]
                    got = translator.translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None, **langs)
                    same = sum(a == b for a, b, e in zip(got, want, ended) if e)
                    row.append(f"{same}/{sum(ended)} ({same / max(sum(ended), 1):.1%})")
                    results[f"{name} {variant} beam {beam}"] = (same, sum(ended))
            except Exception as e:  # noqa: BLE001 - one architecture's failure is its row; the others go on
                row.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
                results[f"{name} {variant} error"] = row[-1]
            print("| " + " | ".join(row) + f" |  <!-- {time.perf_counter() - start:.0f} s -->", flush=True)
    (work / f"results-{args.provider}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
