"""Subword tokenizer: one SentencePiece unigram model shared by English and French.

SentencePiece rather than lower-cased words with <unk>: it keeps case and
punctuation, detokenises exactly (so `tk translate` prints natural French),
and with byte fallback no input character is ever unknown.
"""

from __future__ import annotations

import functools
import io
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from toolkit.core.errors import UsageError, first_line
from toolkit.core.placeholders import SYMBOLS

PAD, UNK, BOS, EOS = 0, 1, 2, 3


# SentencePiece's list calls start a thread pool even for one thread: 0.12 ms for 4 sentences, where 4 single
# calls take 0.01 ms (a single request paid it twice); from about 32 sentences the list call is quicker.
FEW = 32


def normalize(text: str) -> str:
    """NFKC, narrow/no-break spaces to plain spaces, single spaces, stripped.

    The corpus writes French '!' and '?' after a narrow no-break space; NFKC
    folds those to spaces so the same sentence never has two spellings.
    """
    return " ".join(unicodedata.normalize("NFKC", text).split())


WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word ("▁maison")
WORD_END = "</w>"  # end-of-word BPE's mark (subword-nmt's, fairseq's) of a piece that ends a word ("maison</w>")


def piece_begins_word(piece: str) -> bool:
    """Whether a SentencePiece-style piece begins a word: it starts with ▁, or with a character that is no letter or
    digit (punctuation, a placeholder symbol), so a cut before it leaves the word before it whole. "" (an id without a
    piece) begins none."""
    return piece[:1] == WORD_START or (piece[:1] != "" and not piece[0].isalnum())


class TextTokenizer(ABC):
    """What translation asks of a model's tokenizer, whatever its kind (toolkit.core.tokenizers.open_tokenizer opens
    each): text to ids, ids to text, and whether a word boundary lies between two output ids, where a translation the
    loop guard stops may end (toolkit.core.decoding.word_end): a piece that begins a word (SentencePiece's ▁, a
    byte-level BPE's Ġ) or one that ends a word (end-of-word BPE's </w>) says so. Every kind answers from its own
    pieces, so a kind that cannot answer fails when it is made, not when the guard first cuts a translation."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """Each text's ids, from the kind's `_ids(text)`; a kind that encodes a batch at once (tk's own) overrides this."""
        return [self._ids(t) for t in texts]

    @abstractmethod
    def decode(self, ids: list[list[int]]) -> list[str]: ...

    def target_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids as the model would write it in its output (a glossary's target terms, forced in: toolkit.core.
        constrained); the source's ids unless the kind's target side has a vocabulary or segmentation of its own."""
        return self.encode(texts)

    @abstractmethod
    def piece(self, token: int) -> str:
        """Output id `token`'s piece as the tokenizer's vocabulary writes it (▁ where it begins a word); "" for an id it
        has no piece for."""

    @property
    def alphabet(self) -> frozenset[str] | None:
        """The characters its pieces spell, or None where the kind does not say (every character then counts as spelled)."""
        return None

    def begins_word(self, token: int) -> bool:
        """Whether output id `token` begins a word (piece_begins_word of its piece)."""
        return piece_begins_word(self.piece(token))

    def ends_word(self, token: int) -> bool:
        """Whether output id `token` ends a word: its piece ends with end-of-word BPE's </w>."""
        return self.piece(token).endswith(WORD_END)

    def boundary(self, before: int, after: int) -> bool:
        """Whether a word boundary lies between output ids `before` and `after`: a cut there leaves whole words."""
        return self.ends_word(before) or self.begins_word(after)


class Tokenizer(TextTokenizer):
    """Encodes text to ids and decodes ids back to detokenised, cased text."""

    def __init__(self, model_proto: bytes):
        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        # Ids never shown as text: tk's are 0 to 3 (PAD, UNK, BOS, EOS); another model's (an adapter's) its own.
        self.specials = {i for i in (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) if i >= 0}

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        try:
            tokenizer = cls(Path(path).read_bytes())
            tokenizer.sp.encode("a")  # an empty proto loads without complaint and fails only here
            return tokenizer
        except (OSError, RuntimeError, ValueError) as e:  # sentencepiece: RuntimeError, or UnicodeDecodeError for a corrupt piece
            raise UsageError(f"tokenizer {path} is unreadable or corrupt ({first_line(e, 80)}); re-export the model directory") from None

    @classmethod
    def train(cls, sentences: Iterable[str], vocab_size: int, seed: int = 0) -> Tokenizer:
        """Trains a unigram model on the given (training split) sentences."""
        sentences = list(sentences)
        # A tiny corpus cannot support a large vocabulary; cap it rather than fail.
        chars = {c for s in sentences for c in s}
        required = 256 + 4 + len(SYMBOLS) + len(chars)  # byte fallback pieces, specials, every character
        words = {w for s in sentences for w in s.split()}
        vocab_size = max(required + 16, min(vocab_size, required + 2 * len(words)))
        out = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=out, vocab_size=vocab_size,
            model_type="unigram", character_coverage=1.0, byte_fallback=True,
            pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, normalization_rule_name="identity",
            input_sentence_size=2_000_000, shuffle_input_sentence=False,
            hard_vocab_limit=False, num_threads=2, minloglevel=2,
            # Placeholder symbols are single pieces, so a protected span costs one token to copy.
            user_defined_symbols=SYMBOLS,
        )
        return cls(out.getvalue())

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.model_proto)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        texts = [normalize(t) for t in texts]
        if len(texts) < FEW:
            return [self.sp.encode(t) for t in texts]
        return self.sp.encode(texts, num_threads=threads)

    def decode(self, ids: list[list[int]]) -> list[str]:
        specials = self.specials
        ids = [[i for i in seq if i not in specials] for seq in ids]
        if len(ids) < FEW:
            return [self.sp.decode(seq) for seq in ids]
        return self.sp.decode(ids)

    def piece(self, token: int) -> str:
        return self.sp.id_to_piece(token) if 0 <= token < self.sp.get_piece_size() else ""

    @functools.cached_property
    def alphabet(self) -> frozenset[str]:
        """The characters its pieces spell, byte-fallback and control pieces aside: every character of the text it was
        trained on (character_coverage 1.0). Any other reaches the model as raw UTF-8 bytes, which it rarely met."""
        sp = self.sp
        pieces = sp.id_to_piece(list(range(sp.get_piece_size())))
        # Only pieces written <...> can be byte (<0x41>), control (<s>) or unknown ones: only those are asked about
        # (2 ms for the shipped model's 6,000 pieces, against 6 asking about every piece).
        return frozenset("".join(p for i, p in enumerate(pieces)
                                 if not (p[:1] == "<" and p[-1:] == ">" and (sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i))))) - {"▁"}
