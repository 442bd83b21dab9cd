"""FSMTTokenizer's ids and text without torch or transformers (fairseq's WMT19 models; the tokenizer kind
toolkit.core.entries.fsmt declares).

The source as transformers' FSMTTokenizer makes it: Moses punctuation normalisation in the source language (its
unicode-punctuation replacements first), control characters dropped, Moses tokenisation (aggressive dash splits,
escaping `'` as `&apos;`), then byte-pair merges with "</w>" on each word's last symbol, every piece looked up in
vocab-src.json (<unk> for none), </s> after. The output ids back through vocab-tgt.json, special tokens dropped, the
pieces joined at their "</w>" and Moses-detokenised in the target language. The Moses steps are sacremoses' (what
FSMTTokenizer calls); the merges are the few lines below, FSMTTokenizer's own rule to the letter (a rank per merges.txt
line, the last of a repeated line winning, the file's last line only when it ends with a newline), which the
`tokenizers` library's BPE model does not keep: it needs every merge's result in one vocabulary, where FSMT's two
vocabularies hold only the pieces of their side.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from toolkit.core.declaration import TokenizerDeclaration
from toolkit.core.errors import UsageError, first_line
from toolkit.core.tokenizer import WORD_END, TextTokenizer
from toolkit.core.tokenizers import read_vocab

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # FSMTTokenizer's special tokens, dropped from decoded text
CACHE_WORDS = 100_000  # the words whose pieces are remembered (a server's cache stays bounded)
MAX_MERGES_BYTES = 64 << 20


def read_merges(path: Path) -> dict[tuple[str, ...], int]:
    """merges.txt as FSMTTokenizer reads it: each line's first two fields (a count may follow) ranked by line."""
    try:
        if path.stat().st_size > MAX_MERGES_BYTES:
            raise UsageError(f"{path} is over {MAX_MERGES_BYTES >> 20} MB, too large for BPE merges; is it the right file?")
        lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"BPE merges {path} are unreadable ({first_line(e, 80)}); re-export the model directory") from None
    return {tuple(line.split()[:2]): rank for rank, line in enumerate(lines)}


def moses():
    """sacremoses, or one line saying how to install it."""
    try:
        import sacremoses
    except ImportError:
        raise UsageError("an FSMT model's tokenizer needs sacremoses (Moses tokenisation): pip install sacremoses") from None
    return sacremoses


class FsmtTokenizer(TextTokenizer):
    """FSMTTokenizer's ids (vocab-src.json's) and text (vocab-tgt.json's) for one language pair (see the module)."""

    def __init__(self, source_vocab: dict[str, int], target_vocab: dict[str, int], ranks: dict[tuple[str, ...], int],
                 source_lang: str, target_lang: str):
        sm = moses()
        self.vocab, self.ranks = source_vocab, ranks
        self.pieces = {i: p for p, i in target_vocab.items()}
        missing = next((s for s in ("<unk>", "</s>") if s not in source_vocab), None)
        if missing is not None:
            raise UsageError(f"the FSMT source vocabulary has no {missing} token; re-export the model directory")
        self.unk, self.end = source_vocab["<unk>"], source_vocab["</s>"]
        # FSMTTokenizer drops its special tokens by their source-vocabulary ids, whatever the target vocabulary says
        self.special = {source_vocab[s] for s in SPECIALS if s in source_vocab}
        self.normalizer = sm.MosesPunctNormalizer(lang=source_lang, pre_replace_unicode_punct=True)
        self.moses = sm.MosesTokenizer(lang=source_lang)
        self.detokenizer = sm.MosesDetokenizer(lang=target_lang)
        self.cache: dict[str, list[str]] = {}

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, rules=None) -> FsmtTokenizer:
        """The declared merges (`source`), the two sides' vocabularies and the language pair."""
        if declared.target_vocab is None or declared.source_lang is None or declared.target_lang is None:
            raise UsageError("declaration.tokenizer: an FSMT tokenizer needs both vocabularies and its language pair; re-export")
        return cls(read_vocab(directory / declared.vocab), read_vocab(directory / declared.target_vocab),
                   read_merges(directory / declared.source), declared.source_lang, declared.target_lang)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def words(self, text: str) -> list[str]:
        """FSMTTokenizer's moses_pipeline and moses_tokenize: the Moses tokens of `text`."""
        text = self.normalizer.normalize(text)
        text = "".join(c for c in text if not unicodedata.category(c).startswith("C"))
        return self.moses.tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)

    def bpe(self, word: str) -> list[str]:
        """The pieces of one Moses token: the lowest-ranked adjacent pair merged everywhere, until none is ranked."""
        pieces = self.cache.get(word)
        if pieces is not None:
            return pieces
        symbols = [*word[:-1], word[-1] + WORD_END]
        while len(symbols) > 1:
            pair = min(zip(symbols, symbols[1:]), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        if len(self.cache) >= CACHE_WORDS:
            self.cache.clear()
        self.cache[word] = symbols
        return symbols

    def _ids(self, text: str) -> list[int]:
        if not text:
            return []  # an empty line stays empty
        return [self.vocab.get(p, self.unk) for w in self.words(text) if w for p in self.bpe(w)] + [self.end]

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return [self._ids(t) for t in texts]

    def decode(self, ids: list[list[int]]) -> list[str]:
        out = []
        for seq in ids:
            # an id vocab-tgt.json has no piece for is dropped (transformers 4 drops it; 5 writes <unk>)
            pieces = [self.pieces[i] for i in seq if i not in self.special and i in self.pieces]
            out.append(self.detokenizer.detokenize("".join(p.replace(" ", "").replace(WORD_END, " ") for p in pieces).split()))
        return out

    def piece(self, token: int) -> str:
        """The target piece, which marks a word's end ("ata</w>"): the loop guard cuts after it (TextTokenizer.boundary)."""
        return self.pieces.get(token, "")
