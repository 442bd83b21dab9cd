"""`tk evaluate`: scores of an exported model on the held-out split, the Tatoeba Challenge set, and as people type."""

from __future__ import annotations

from toolkit.core.scoring import bleu_chrf, sentence_chrf


def evaluate_model(directory, corpus_path=None, challenge_path=None, beams=(1, 4), batch_size: int = 64,
                   limit: int | None = None, threads: int | None = None, variant: str = "fp32", echo=print,
                   languages: dict | None = None, provider: str = "cpu") -> dict:
    """Scores an exported translation model with ONNX Runtime on the held-out test split
    (all references of each English sentence, and single-reference) and on the public
    Tatoeba Challenge test set (single reference, as published models report it). `languages`: a multilingual model's
    source_lang and target_lang (None: its default pair). `provider`: cuda refuses a silent CPU run, as tk translate."""
    import time
    from pathlib import Path

    from toolkit.core import data
    from toolkit.core.batching import DecodeOptions
    from toolkit.deploy.translate import open_model

    model = open_model(directory, provider, variant, threads=threads).for_languages(**(languages or {}))
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
    results: dict = {"variant": variant, "provider": model.provider, "test_split_english_sentences": len(english),
                     "test_split_pairs": sum(len(r) for r in refs)}
    for beam in beams:
        search = "greedy" if beam == 1 else f"beam{beam}"
        for name, (src, references) in sets.items():
            start = time.perf_counter()
            # What a user of tk translate gets: input handling and decoding guards on.
            opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam, batch_size=batch_size)
            best = translations(model, src, opts, echo=echo, what=f"{name} {search}")
            hyps = [h.text for h in best]
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
            if len(best) < 2:  # confidence ranks sentences against each other: one sentence (--limit 1) has nothing to rank
                echo(f"confidence, {name} {search}: not measured on one sentence")
                continue
            rated = confidence_report(best, references, model.manifest)
            results[f"{name}_{search}"]["confidence"] = rated
            echo(confidence_line(f"{name} {search}", rated))
    return results


def confidence_report(best: list, references: list[list[str]], manifest) -> dict:
    """How well the translations' confidences single out the bad ones (toolkit.core.confidence.report, against each
    sentence's chrF), and whether the model's calibration gave them (else the uncalibrated default map)."""
    from toolkit.core import confidence

    calibration = confidence.for_manifest(manifest)
    out = confidence.report([h.confidence for h in best], sentence_chrf([h.text for h in best], references), calibration.threshold)
    return {**out, "calibrated": calibration.calibrated}


def confidence_line(what: str, rated: dict) -> str:
    """'confidence, tatoeba_challenge greedy: the 10% least confident translations average chrF 38.88, the rest 67.70
    (gap 28.81); Spearman 0.544; mean confidence 0.734, share reaching chrF 50 0.685 (2,000 sentences)'."""
    return (f"confidence, {what}: the {rated['low_share']:.0%} least confident translations average chrF {rated['low_chrf']:.2f}, "
            f"the rest {rated['rest_chrf']:.2f} (gap {rated['gap']:.2f}); Spearman {rated['spearman']:.3f}; mean confidence "
            f"{rated['mean_confidence']:.3f}, share reaching chrF {rated['threshold']:g} {rated['reaching_threshold']:.3f} "
            f"({rated['sentences']:,} sentences)")


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
    """The best translation of each source, as tk translate gives it (see translations)."""
    return [h.text for h in translations(model, sources, opts, backend, text, echo, what)]


def translations(model, sources: list[str], opts, backend=None, text=None, echo=print, what: str = "") -> list:
    """The best Translation of each source (text, score, confidence), as tk translate gives it. A sentence tk fails on
    (an internal error) is scored with what translate_batch gave it (a fallback's or an empty translation) and named in
    a warning: one sentence cannot stop the evaluation."""
    from toolkit.core.textprep import TextOptions
    from toolkit.deploy.translate import failure_notes, translate_batch

    said: list[str] = []
    failed: list[int] = []
    out = [n[0] for n in translate_batch(model, sources, opts, backend, warn=said.append, text=text or TextOptions(), failed=failed)]
    for n, note in failure_notes(said, failed):
        echo(f"warning: {what} sentence {n}: {note}")
    return out


def calibration_set(corpus, challenge_path, limit: int | None = None) -> tuple[list[str], list[list[str]], dict]:
    """What a confidence map is fitted on: the distinct English sentences of the corpus's valid split (held out from
    training) and all their references, every English sentence of the Tatoeba Challenge test file left out (its scores
    are what tk evaluate reports); the first `limit` of them. And what they are, for the manifest."""
    from pathlib import Path

    from toolkit.core import confidence, data

    challenge = [en for en, _ in data.read_challenge_test(Path(challenge_path))]
    pairs = confidence.held_out(corpus.splits["valid"], challenge)
    english, refs = data.references(pairs)
    english, refs = english[:limit], refs[:limit]
    left_out = len({en for en, _ in corpus.splits["valid"]} & set(challenge))
    return english, refs, {"split": "valid", "english_sentences": len(english), "pairs": sum(map(len, refs)),
                           "challenge_sentences_left_out": left_out, "challenge": Path(challenge_path).name,
                           "corpus_sha256": corpus.sha256}


def calibrate_model(directory, corpus_path=None, challenge_path=None, beam: int = 1, batch_size: int = 64, limit: int | None = None,
                    threads: int | None = None, variant: str = "fp32", echo=print, languages: dict | None = None) -> dict:
    """Fits the model's confidence map (toolkit.core.confidence.fit) on held-out sentences (calibration_set) translated
    as tk translate translates them at `beam`, and stores it in the directory's manifest.json, where tk translate,
    tk serve and the API find it. Returns what was stored."""
    from toolkit.core import confidence, data
    from toolkit.core import manifest as manifest_mod
    from toolkit.core.batching import DecodeOptions
    from toolkit.core.errors import UsageError
    from toolkit.deploy.translate import open_model

    if not challenge_path:
        raise UsageError("--calibrate fits on held-out sentences with every Tatoeba Challenge test sentence left out: give "
                         "--challenge FILE (e.g. ../shared/data/tatoeba-test-eng-fra.txt)")
    model = open_model(directory, "cpu", variant, threads=threads).for_languages(**(languages or {}))
    corpus = data.load_corpus(corpus_path, download=corpus_path is None)
    english, refs, info = calibration_set(corpus, challenge_path, limit)
    echo(f"calibrating confidence on {len(english):,} held-out sentences (the valid split, "
         f"{info['challenge_sentences_left_out']:,} Tatoeba Challenge sentences left out)")
    opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam, batch_size=batch_size)
    best = translations(model, english, opts, echo=echo, what="calibration")
    chrf = sentence_chrf([h.text for h in best], refs)
    fitted = confidence.fit([h.signals or confidence.Signals(h.score) for h in best], chrf,
                            fitted={**info, "beam": beam, "variant": variant})
    with manifest_mod.updating(directory) as m:
        m.confidence = fitted.to_dict()
    echo(f"stored in {manifest_mod.NAME}: P(sentence chrF >= {fitted.threshold:g}) = logistic({fitted.bias:.3f} + "
         + " + ".join(f"{w:.3f} x {f}" for w, f in zip(fitted.weights, confidence.FEATURES)) + ")")
    return fitted.to_dict()


def score_line(what: str, scores: dict) -> str:
    """One line a person reads while the scores come in (the whole record is printed once, as JSON, at the end):
    'test_split greedy: BLEU 55.28, chrF 71.20 (1,000 sentences, 12.3 s)'."""
    shown = [f"{label} {scores[key]:.2f}" for key, label in (("bleu", "BLEU"), ("bleu_multi_ref", "BLEU"), ("chrf", "chrF"),
                                                             ("chrf_multi_ref", "chrF"), ("copied", "copied")) if key in scores]
    extra = [f"{scores['sentences']:,} sentences"] if "sentences" in scores else []
    extra += [f"{scores['seconds']} s"] if "seconds" in scores else []
    return f"{what}: {', '.join(shown) or 'done'}" + (f" ({', '.join(extra)})" if extra else "")
