"""Scores on detokenised, cased text with sacrebleu (BLEU and chrF), the field's common yardstick."""

from __future__ import annotations


def bleu_chrf(hypotheses: list[str], references: list[list[str]]) -> dict:
    """Corpus BLEU and chrF; each hypothesis may have any number of references.

    sacrebleu takes reference *streams*; sentences with fewer references pad
    their streams with None, which sacrebleu skips.
    """
    import sacrebleu

    width = max(len(r) for r in references)
    streams = [[r[i] if i < len(r) else None for r in references] for i in range(width)]
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, streams)
    chrf = chrf_metric.corpus_score(hypotheses, streams)
    return {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2), "signature": str(bleu_metric.get_signature()),
            "sentences": len(hypotheses), "max_references": width}


def evaluate_model(directory, corpus_path=None, challenge_path=None, beams=(1, 4), batch_size: int = 64,
                   limit: int | None = None, threads: int | None = None, variant: str = "fp32", echo=print) -> dict:
    """Scores an exported translation model with ONNX Runtime on the held-out test split
    (all references of each English sentence, and single-reference) and on the public
    Tatoeba Challenge test set (single reference, as published models report it)."""
    import time
    from pathlib import Path

    from toolkit import data
    from toolkit.batching import DecodeOptions, translate_texts
    from toolkit.translate import open_model

    model = open_model(directory, "cpu", variant, threads=threads)
    if model.built_s:
        echo(f"{variant} graphs: not stored in {directory}, built in memory from its fp32 graphs in {model.built_s:.2f}s")
    corpus = data.load_corpus(corpus_path, download=corpus_path is None)
    if corpus.sha256 != (model.manifest.data.get("training") or {}).get("data", {}).get("sha256", corpus.sha256):
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
            hyps = translate_texts(model.backend(), model.tokenizer, src,
                                   DecodeOptions(beam=beam, batch_size=batch_size, max_len=model.manifest.max_len,
                                                 max_src_len=model.manifest.max_len))
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
            echo(f"{name} {search}: {results[f'{name}_{search}']}")
    return results
