"""The tokenizer a model directory declares: tk's shared SentencePiece model, or Hugging Face's MarianTokenizer layout.

`open_tokenizer(manifest)` is how every command gets a model's tokenizer. Torch-free and transformers-free: the Marian
layout is read here with sentencepiece and json alone, to the same ids and text as transformers' MarianTokenizer
(tests/test_hf_marian.py compares them).
"""

from __future__ import annotations

import json
from pathlib import Path

import sentencepiece as spm

from toolkit.core.declaration import TokenizerDeclaration
from toolkit.core.errors import UsageError, first_line
from toolkit.core.tokenizer import Tokenizer

MAX_VOCAB_BYTES = 64 << 20  # a vocab.json is about 1 MB at 58k pieces; anything far larger is not one


def open_tokenizer(m) -> Tokenizer | MarianTokenizer:
    """The tokenizer of the translation model in manifest `m` (a usage error for any other directory)."""
    path = m.translation_tokenizer()
    declared = m.declared().tokenizer
    if declared.kind == "marian":
        return MarianTokenizer.load(m.directory, declared, m.rules().end, m.rules().pad)
    return Tokenizer.load(path)


def read_json_object(path: Path, max_bytes: int, what: str) -> dict:
    """A JSON object from an untrusted file, in one line when it is too large, unreadable or not an object."""
    try:
        if path.stat().st_size > max_bytes:
            raise UsageError(f"{path} is over {max_bytes >> 20} MB, too large for {what}; is it the right file?")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{path} is not readable JSON ({first_line(e, 80)})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object ({what})")
    return data


def read_vocab(path: Path) -> dict[str, int]:
    """A Marian vocab.json: piece -> id, each id a whole number."""
    data = read_json_object(path, MAX_VOCAB_BYTES, "a vocabulary")
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in data.items()):
        raise UsageError(f"vocabulary {path} must map pieces to token ids (a JSON object of whole numbers); re-export")
    return data


def _load_spm(path: Path) -> spm.SentencePieceProcessor:
    try:
        sp = spm.SentencePieceProcessor(model_proto=path.read_bytes())
        sp.encode("a")  # an empty proto loads without complaint and fails only here
        return sp
    except (OSError, RuntimeError) as e:
        raise UsageError(f"tokenizer {path} is unreadable or corrupt ({first_line(e, 80)}); re-export the model directory") from None


class MarianTokenizer:
    """MarianTokenizer's ids and text: SentencePiece pieces looked up in vocab.json (unknown pieces: <unk>), the end
    token appended to each source, a leading language code (`>>fr<<`) kept as one token; output ids back to pieces
    through the target vocabulary, special tokens dropped, and joined by a SentencePiece model (the source one when
    the vocabulary is shared, as transformers does)."""

    def __init__(self, source: spm.SentencePieceProcessor, target: spm.SentencePieceProcessor, vocab: dict[str, int],
                 target_vocab: dict[str, int] | None, unk: int, end: int, pad: int):
        self.source, self.target = source, target
        self.vocab = vocab
        self.pieces = {i: p for p, i in (target_vocab or vocab).items()}
        self.join_with = target if target_vocab is not None else source
        self.unk, self.end, self.pad = unk, end, pad
        self.special = {unk, end, pad}

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, end: int, pad: int) -> MarianTokenizer:
        source = _load_spm(directory / declared.source)
        target = _load_spm(directory / (declared.target or declared.source))
        vocab = read_vocab(directory / declared.vocab)
        target_vocab = read_vocab(directory / declared.target_vocab) if declared.target_vocab else None
        return cls(source, target, vocab, target_vocab, declared.unk, end, pad)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _ids(self, text: str) -> list[int]:
        if not text:
            return []  # an empty line stays empty (transformers would decode its lone end token)
        code = []
        if text.startswith(">>") and (stop := text.find("<<")) != -1:
            code, text = [text[: stop + 2]], text[stop + 2:]
        pieces = code + self.source.encode(text, out_type=str)
        return [self.vocab.get(p, self.unk) for p in pieces] + [self.end]

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return [self._ids(t) for t in texts]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [self.join_with.decode_pieces([p for p in map(self._piece, seq) if p]).replace("\u2581", " ").strip() for seq in ids]

    def _piece(self, i: int) -> str:
        """The vocabulary's piece of id `i`; a special token none; an id outside the vocabulary the SentencePiece model's."""
        if i in self.special:
            return ""
        piece = self.pieces.get(i)
        if piece is None and 0 <= i < self.join_with.get_piece_size():
            piece = self.join_with.id_to_piece(i)
        return piece or ""

