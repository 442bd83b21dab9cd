"""BLEU and chrF with sacrebleu on detokenised, cased text: the field's common yardstick. A leaf module."""

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


def sentence_chrf(hypotheses: list[str], references: list[list[str]]) -> list[float]:
    """chrF of each hypothesis against its own references (sacrebleu's sentence score: the best-matching reference's)."""
    import sacrebleu

    metric = sacrebleu.CHRF()
    return [metric.sentence_score(h, r).score for h, r in zip(hypotheses, references)]
