"""A word-level vocabulary (a token list, as d2l's Vocab keeps one) and its tokenizer, torch-free.

An adapter may declare `WordVocab(tokens)` instead of a SentencePiece model. Export stores it as plain JSON
(`vocab.json`: the token list and the split rule, never a pickle); the deploy side reads it back here and splits text
by the declared rule, every word outside the list becoming `<unk>`. The same rule tokenizes at export, verify and
translate, so the ids the graphs see never depend on which command runs them.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import UsageError, first_line
from toolkit.core.tokenizer import TextTokenizer

SPECIALS = ("<unk>", "<pad>", "<bos>", "<eos>")
SPLITS = ("whitespace", "punctuation")
MAX_VOCAB_BYTES = 64 << 20  # a million words is about 10 MB of JSON: anything far larger is not a vocabulary
FILE = "vocab.json"
TARGET_FILE = "target_vocab.json"  # the target side's, where a model keeps a vocabulary per language


@dataclass(frozen=True)
class WordVocab:
    """tokens: id -> word (ids are positions), holding `<unk>`, `<pad>`, `<bos>` and `<eos>`.
    split "punctuation": whitespace, and each character of `punctuation` a word of its own ("home." -> "home", ".");
    "whitespace": whitespace only. lowercase: the text is lower-cased first (d2l's preprocessing)."""

    tokens: tuple[str, ...]
    split: str = "punctuation"
    lowercase: bool = True
    punctuation: str = ",.!?"
    ids: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.tokens, (str, bytes)) or not hasattr(self.tokens, "__iter__"):
            raise UsageError(f"WordVocab: tokens must be a list of words (id -> word), got a {type(self.tokens).__name__}")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        problem = self.problem()
        if problem:
            raise UsageError(f"WordVocab: {problem}")
        object.__setattr__(self, "ids", {t: i for i, t in enumerate(self.tokens)})

    def problem(self) -> str | None:
        if not all(isinstance(t, str) and t and not any(c.isspace() for c in t) for t in self.tokens):
            return "every token must be a non-empty string without spaces"
        if len(set(self.tokens)) != len(self.tokens):
            return "a token appears twice in the list"
        missing = [s for s in SPECIALS if s not in self.tokens]
        if missing:
            return f"the list has no {missing[0]} (it needs {', '.join(SPECIALS)})"
        if self.split not in SPLITS:
            return f"split must be one of {', '.join(SPLITS)}, got {self.split!r}"
        if not isinstance(self.lowercase, bool):
            return f"lowercase must be true or false, got {self.lowercase!r}"
        if not isinstance(self.punctuation, str) or any(c.isspace() or c.isalnum() for c in self.punctuation):
            return f"punctuation must be a string of punctuation characters, got {self.punctuation!r}"
        return None

    def special(self, name: str) -> int:
        return self.ids[f"<{name}>"]

    def words(self, text: str) -> list[str]:
        """The text split by the declared rule (NFKC first, so a no-break space is a space)."""
        text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        if self.split == "whitespace" or not self.punctuation:
            return text.split()
        marks = re.escape(self.punctuation)
        return re.findall(rf"[{marks}]|[^\s{marks}]+", text)

    def to_json(self) -> str:
        return json.dumps({"format": "tk-word-vocab", "tokens": list(self.tokens), "split": self.split,
                           "lowercase": self.lowercase, "punctuation": self.punctuation}, ensure_ascii=False)

    @classmethod
    def read(cls, path: Path) -> WordVocab:
        """From an untrusted file: plain JSON, checked field by field; a bad one is one line."""
        try:
            if path.stat().st_size > MAX_VOCAB_BYTES:
                raise UsageError(f"{path} is over {MAX_VOCAB_BYTES >> 20} MB, too large for a word vocabulary")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise UsageError(f"{path} is not readable JSON ({first_line(e, 80)}); re-export the model directory") from None
        if not isinstance(data, dict) or data.get("format") != "tk-word-vocab" or not isinstance(data.get("tokens"), list):
            raise UsageError(f"{path} is not a tk word vocabulary (a JSON object with format tk-word-vocab and tokens); re-export")
        known = {"format", "tokens", "split", "lowercase", "punctuation"}
        if set(data) - known:
            raise UsageError(f"{path}: {sorted(set(data) - known)[0]!r} is not a word vocabulary field; re-export")
        try:
            return cls(data["tokens"], data.get("split", "punctuation"), data.get("lowercase", True), data.get("punctuation", ",.!?"))
        except UsageError as e:
            raise UsageError(f"{path}: {e}; re-export the model directory") from None


class WordTokenizer(TextTokenizer):
    """Text <-> ids through a WordVocab (a source one and a target one where the model keeps two): unknown words to
    `<unk>`, the source's `<eos>` after each source when the model was trained so (`source_end`); output ids back to
    the target's words, special tokens dropped, no space before punctuation."""

    def __init__(self, vocab: WordVocab, source_end: bool = False, target: WordVocab | None = None):
        self.vocab, self.source_end = vocab, source_end
        self.target = target or vocab
        self.unk, self.end = vocab.special("unk"), vocab.special("eos")
        self.specials = {self.target.special(s) for s in ("unk", "pad", "bos", "eos")}

    @classmethod
    def load(cls, path: Path, source_end: bool = False, target: Path | None = None) -> WordTokenizer:
        return cls(WordVocab.read(path), source_end, WordVocab.read(target) if target is not None else None)

    @property
    def vocab_size(self) -> int:
        return len(self.target.tokens)

    def _ids(self, text: str) -> list[int]:
        ids = [self.vocab.ids.get(w, self.unk) for w in self.vocab.words(text)]
        return ids + [self.end] if ids and self.source_end else ids  # an empty line stays empty

    def decode(self, ids: list[list[int]]) -> list[str]:
        target = self.target
        out = []
        for seq in ids:
            words = [target.tokens[i] for i in seq if i not in self.specials and 0 <= i < len(target.tokens)]
            text = " ".join(words)
            if target.split == "punctuation" and target.punctuation:
                text = re.sub(rf" ([{re.escape(target.punctuation)}])", r"\1", text)
            out.append(text)
        return out

    def piece(self, token: int) -> str:
        return self.target.tokens[token] if 0 <= token < len(self.target.tokens) else ""

    def begins_word(self, token: int) -> bool:
        """Every word of the list is one: a cut before any leaves the words before it whole."""
        return 0 <= token < len(self.target.tokens)
