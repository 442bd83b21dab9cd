"""`tk evaluate`: scores of an exported model on the held-out split, the Tatoeba Challenge set, and as people type."""

from __future__ import annotations

from toolkit.core.scoring import bleu_chrf


def evaluate_model(directory, corpus_path=None, challenge_path=None, beams=(1, 4), batch_size: int = 64,
                   limit: int | None = None, threads: int | None = None, variant: str = "fp32", echo=print,
                   languages: dict | None = None) -> dict:
    """Scores an exported translation model with ONNX Runtime on the held-out test split
    (all references of each English sentence, and single-reference) and on the public
    Tatoeba Challenge test set (single reference, as published models report it). `languages`: a multilingual
    model's source_lang and target_lang, as tk translate takes them (None: its default pair)."""
    import time
    from pathlib import Path

    from toolkit.core import data
    from toolkit.core.batching import DecodeOptions
    from toolkit.deploy.translate import open_model

    model = open_model(directory, "cpu", variant, threads=threads).for_languages(**(languages or {}))
    if model.built_s:
        echo(f"{variant} graphs: not stored in {directory}, built in memory from its fp32 graphs in {model.built_s:.2f}s")
    corpus = data.load_corpus(corpus_path, download=corpus_path is None)
    echo(data.describe(corpus))
    trained_on = ((model.manifest.training and model.manifest.training.data) or {}).get("sha256", corpus.sha256)
    if corpus.sha256 != trained_on:
        echo("warning: this corpus differs from the one the model was trained on; the test split may not be held out")
    english, refs = data.references(corpus.splits["test"])
    english, refs = english[:limit], refs[:limit]
    sets = {"test_split": (english, refs)}
    if challenge_path:
        pairs = data.read_challenge_test(Path(challenge_path))[:limit]
        sets["tatoeba_challenge"] = ([en for en, _ in pairs], [[fr] for _, fr in pairs])
    results: dict = {"variant": variant, "test_split_english_sentences": len(english), "test_split_pairs": sum(len(r) for r in refs)}
    for beam in beams:
        search = "greedy" if beam == 1 else f"beam{beam}"
        for name, (src, references) in sets.items():
            start = time.perf_counter()
            # What a user of tk translate gets: input handling and decoding guards on.
            opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam, batch_size=batch_size)
            hyps = translated(model, src, opts, echo=echo, what=f"{name} {search}")
            seconds = time.perf_counter() - start
            if name == "test_split":
                multi = bleu_chrf(hyps, references)
                # Single reference: every (English, French) pair of the split, as its own line.
                single_h = [h for h, r in zip(hyps, references) for _ in r]
                single = bleu_chrf(single_h, [[x] for r in references for x in r])
                results[f"{name}_{search}"] = {"bleu_multi_ref": multi["bleu"], "chrf_multi_ref": multi["chrf"],
                                               "bleu_single_ref": single["bleu"], "chrf_single_ref": single["chrf"],
                                               "max_references": multi["max_references"], "sentences": len(src),
                                               "seconds": round(seconds, 1), "signature": multi["signature"]}
            else:
                s = bleu_chrf(hyps, references)
                results[f"{name}_{search}"] = {"bleu": s["bleu"], "chrf": s["chrf"], "sentences": len(src),
                                               "seconds": round(seconds, 1), "signature": s["signature"]}
            echo(score_line(f"{name} {search}", results[f"{name}_{search}"]))
    return results


def evaluate_robustness(directory, corpus_path=None, beam: int = 4, batch_size: int = 64, limit: int | None = None,
                        threads: int | None = None, variant: str = "fp32", seed: int = 0, raw: bool = False, echo=print,
                        languages: dict | None = None) -> dict:
    """Translates every robustness set (toolkit.deploy.robustness) with the decoding guards on, as
    tk translate does, and again with them off to measure the runaway rate they would hide. `languages`: as
    evaluate_model's."""
    import time

    from toolkit.core import data
    from toolkit.core.batching import GUARDED, DecodeOptions
    from toolkit.core.textprep import TextOptions
    from toolkit.deploy import robustness
    from toolkit.deploy.translate import open_model

    model = open_model(directory, "cpu", variant, threads=threads).for_languages(**(languages or {}))
    corpus = data.load_corpus(corpus_path, download=corpus_path is None)
    echo(data.describe(corpus))
    english, refs = data.references(corpus.splits["test"])
    english, refs = english[:limit], refs[:limit]
    text = TextOptions(enabled=not raw)
    words = {w.strip(".,!?;:\"'") for en, fr in corpus.splits["train"] for w in f"{en} {fr}".split()}
    sets = robustness.build_sets(english, refs, words, seed)
    guarded_opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam, batch_size=batch_size)
    bare_opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam, batch_size=batch_size, max_len_a=None,
                                           loop_guard=False)
    backend = model.backend()
    results: dict = {"variant": variant, "search": "greedy" if beam == 1 else f"beam{beam}", "seed": seed,
                     "guards": GUARDED, "input_handling": not raw, "sets": {}}
    for s in sets:
        start = time.perf_counter()
        guarded = translated(model, s.sources, guarded_opts, backend, text, echo, f"robustness {s.name}")
        bare = translated(model, s.sources, bare_opts, backend, text, echo, f"robustness {s.name} unguarded")
        r = robustness.score_set(s, guarded)
        r["runaway_guarded"] = round(100 * sum(map(robustness.is_runaway, s.sources, guarded)) / max(len(guarded), 1), 2)
        r["runaway_unguarded"] = round(100 * sum(map(robustness.is_runaway, s.sources, bare)) / max(len(bare), 1), 2)
        r["seconds"] = round(time.perf_counter() - start, 1)
        results["sets"][s.name] = r
        echo(score_line(f"robustness {s.name}", r))
    return results


def translated(model, sources: list[str], opts, backend=None, text=None, echo=print, what: str = "") -> list[str]:
    """The best translation of each source, as tk translate gives it. A sentence tk fails on (an internal error) is
    scored with what translate_batch gave it (a fallback's or an empty translation) and named in a warning: one
    sentence cannot stop the evaluation."""
    from toolkit.core.textprep import TextOptions
    from toolkit.deploy.translate import failure_notes, translate_batch

    said: list[str] = []
    failed: list[int] = []
    out = [n[0].text for n in translate_batch(model, sources, opts, backend, warn=said.append, text=text or TextOptions(),
                                              failed=failed)]
    for n, note in failure_notes(said, failed):
        echo(f"warning: {what} sentence {n}: {note}")
    return out


def score_line(what: str, scores: dict) -> str:
    """One line a person reads while the scores come in (the whole record is printed once, as JSON, at the end):
    'test_split greedy: BLEU 55.28, chrF 71.20 (1,000 sentences, 12.3 s)'."""
    shown = [f"{label} {scores[key]:.2f}" for key, label in (("bleu", "BLEU"), ("bleu_multi_ref", "BLEU"), ("chrf", "chrF"),
                                                             ("chrf_multi_ref", "chrF"), ("copied", "copied")) if key in scores]
    extra = [f"{scores['sentences']:,} sentences"] if "sentences" in scores else []
    extra += [f"{scores['seconds']} s"] if "seconds" in scores else []
    return f"{what}: {', '.join(shown) or 'done'}" + (f" ({', '.join(extra)})" if extra else "")
