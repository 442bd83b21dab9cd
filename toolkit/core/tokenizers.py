"""The tokenizer a model directory declares: tk's shared SentencePiece model, or Hugging Face's MarianTokenizer layout.

`open_tokenizer(manifest)` is how every command gets a model's tokenizer. Torch-free and transformers-free: the Marian
layout is read here with sentencepiece and json alone, to the same ids and text as transformers' MarianTokenizer
(tests/pytorch/test_hf_marian.py compares them).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

import sentencepiece as spm

from toolkit.core import architectures  # noqa: F401 (its entries add their tokenizer kinds to TOKENIZERS)
from toolkit.core.declaration import TOKENIZERS, Declaration, DecodingRules, TokenizerDeclaration
from toolkit.core.errors import DataError, UsageError, first_line
from toolkit.core.tokenizer import WORD_START, TextTokenizer, Tokenizer

if TYPE_CHECKING:  # the annotations only: the manifest module is not needed to tokenize
    from toolkit.core.manifest import Manifest

MAX_VOCAB_BYTES = 64 << 20  # a vocab.json is about 1 MB at 58k pieces; anything far larger is not one


def open_tokenizer(m) -> TextTokenizer:
    """The tokenizer of the translation model in manifest `m` (a usage error for any other directory): the loader of
    the kind its declaration names (toolkit.core.declaration.TOKENIZERS), each a TextTokenizer."""
    path = m.translation_tokenizer()
    declared = m.declared().tokenizer
    loader = TOKENIZERS[declared.kind].loader
    if loader is not None:
        module, _, name = loader.partition(":")
        return attrgetter(name)(importlib.import_module(module))(m.directory, declared, m.rules())
    if declared.source_end:
        return source_end_tokenizer(path, m.rules().end)
    return Tokenizer.load(path)


def word_tokenizer(directory: Path, declared: TokenizerDeclaration, rules=None):
    """An adapter's word-level vocabulary (toolkit.core.word_vocab): plain JSON, split by its declared rule."""
    from toolkit.core.word_vocab import WordTokenizer

    target = directory / declared.target if declared.target else None
    return WordTokenizer.load(directory / declared.source, declared.source_end, target)


def source_end_tokenizer(path: Path, end: int) -> Tokenizer:
    """A SentencePiece model whose sources end with the end token (declaration.tokenizer.source_end): the model was
    trained on `text </s>`, and without it every source would be one the model never saw."""
    tokenizer = Tokenizer.load(path)
    plain = tokenizer.encode
    tokenizer.encode = lambda texts, threads=1: [ids + [end] if ids else ids for ids in plain(texts, threads)]
    return tokenizer


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
    except (OSError, RuntimeError, ValueError) as e:  # ValueError: a piece that is not UTF-8 (UnicodeDecodeError)
        raise UsageError(f"tokenizer {path} is unreadable or corrupt ({first_line(e, 80)}); re-export the model directory") from None


class MarianTokenizer(TextTokenizer):
    """MarianTokenizer's ids and text: SentencePiece pieces looked up in vocab.json (unknown pieces: <unk>), the end
    token appended to each source, a leading language code (`>>fr<<`) kept as one token; output ids back to pieces
    through the target vocabulary, special tokens dropped, and joined by a SentencePiece model (the source one when
    the vocabulary is shared, as transformers does)."""

    def __init__(self, source: spm.SentencePieceProcessor, target: spm.SentencePieceProcessor, vocab: dict[str, int],
                 target_vocab: dict[str, int] | None, unk: int, end: int, pad: int):
        self.source, self.target = source, target
        self.vocab, self.output_vocab = vocab, target_vocab or vocab
        self.pieces = {i: p for p, i in self.output_vocab.items()}
        self.join_with = target if target_vocab is not None else source
        self.unk, self.end, self.pad = unk, end, pad
        self.special = {unk, end, pad}

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, rules) -> MarianTokenizer:
        source = _load_spm(directory / declared.source)
        target = _load_spm(directory / (declared.target or declared.source))
        vocab = read_vocab(directory / declared.vocab)
        target_vocab = read_vocab(directory / declared.target_vocab) if declared.target_vocab else None
        return cls(source, target, vocab, target_vocab, declared.unk, rules.end, rules.pad)

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

    def target_ids(self, texts: list[str]) -> list[list[int]]:
        """Output ids: the target SentencePiece model's pieces in the target vocabulary, no end token appended."""
        return [[self.output_vocab.get(p, self.unk) for p in self.target.encode(t, out_type=str)] for t in texts]

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

    def piece(self, token: int) -> str:
        return self.pieces.get(token, "")


# ---- multilingual models: a language code on the source, the target's token forced first --------------------------

# ISO 639-1 codes people type, to the ISO 639-3 prefix of NLLB's codes (eng_Latn); mBART's (en_XX) and M2M100's (en)
# start with the two-letter code itself. A code that names several of a model's (zho_Hans, zho_Hant) is refused.
ISO3 = {"en": "eng", "fr": "fra", "de": "deu", "es": "spa", "it": "ita", "pt": "por", "nl": "nld", "ru": "rus",
        "zh": "zho", "ja": "jpn", "ko": "kor", "ar": "arb", "tr": "tur", "pl": "pol", "sv": "swe", "fi": "fin",
        "da": "dan", "cs": "ces", "el": "ell", "hi": "hin", "uk": "ukr", "ro": "ron", "hu": "hun", "vi": "vie"}


def language_id(declared: TokenizerDeclaration, code: object, side: str) -> str:
    """The model's own code for what the user typed ("en", "__en__", "eng_Latn", "en_XX"), or one line listing them."""
    codes = declared.languages or {}
    if not isinstance(code, str) or not code:
        raise UsageError(f"{side} language must be a language code such as {next(iter(codes), 'en')!r}, got {code!r}")
    if code in codes:
        return code
    plain = code.strip("_")
    base = {plain, ISO3.get(plain, plain)}
    found = [c for c in codes if c.strip("_").split("_")[0] in base]
    if len(found) == 1:
        return found[0]
    raise UsageError(f"unknown {side} language {code!r}; this model's codes: {', '.join(sorted(codes))}")


def choose_languages(m: Manifest, source_lang: str | None, target_lang: str | None) -> Manifest:
    """The manifest `m` translating from `source_lang` into `target_lang` (None: the model's default, what its files say
    or what `tk export --source-lang/--target-lang` recorded): its declaration names the pair (so the tokenizer opened
    from it puts the source code on every sentence) and its rules force the target's token first. A code the model
    does not know, or any code for a model of one other pair, is one line. The one place a pair is chosen: tk translate,
    translate-corpus, evaluate, verify, serve and the Python API all come here."""
    declared = m.declared().tokenizer
    if TOKENIZERS[declared.kind].task_prefixes:
        return t5_pair(m, source_lang, target_lang)
    if declared.languages is None:
        if source_lang is None and target_lang is None:
            return m
        stated = declared.served()
        if stated and source_lang in (None, *stated["source"]) and target_lang in (None, *stated["target"]):
            return m  # the one pair it translates, named
        pair = f" ({stated['source'][0]} to {stated['target'][0]})" if stated else ""
        raise UsageError(f"{m.directory} is a model of one language pair{pair} ({m.model}); drop --source-lang/--target-lang"
                         + (" or give its own codes" if stated else ""))
    source = language_id(declared, source_lang, "source") if source_lang is not None else declared.source_lang
    target = language_id(declared, target_lang, "target") if target_lang is not None else declared.target_lang
    forced = declared.languages[target]
    rules = m.rules()
    key = language_rule(declared, rules)
    if (source, target) == (declared.source_lang, declared.target_lang) and getattr(rules, key) == forced:
        return m
    chosen = copy.copy(m)
    decoding = {**m.declaration["decoding"], key: forced}
    tokenizer = {**m.declaration["tokenizer"], "source_lang": source, "target_lang": target}
    chosen.declaration = {**m.declaration, "decoding": decoding, "tokenizer": tokenizer}
    chosen.__dict__.pop("_declared", None)
    return chosen


def language_rule(declared: TokenizerDeclaration, rules: DecodingRules) -> str:
    """The decoding rule a multilingual model's target language sets: "forced_first" (generate's forced_bos_token_id),
    or "start" for a model whose decoder starts with its target's token and forces none (mBART-cc25,
    toolkit.pytorch.hf_mbart). tk translate and the browser site (toolkit.convert.web) both choose by it."""
    return "start" if rules.forced_first is None and rules.start == declared.languages[declared.target_lang] else "forced_first"


def with_languages(m, tokenizer, source_lang: str | None, target_lang: str | None):
    """(manifest, tokenizer) translating from `source_lang` into `target_lang` (None: the model's default): the
    tokenizer puts the source code on every sentence, the manifest's rules force the target's token first. A model
    of one language pair refuses a code in one line."""
    chosen = choose_languages(m, source_lang, target_lang)
    if chosen is m:
        return m, tokenizer
    if TOKENIZERS[chosen.declared().tokenizer.kind].task_prefixes:  # no language code: the pair's task prefix
        return chosen, tokenizer.for_pair(chosen.declared().tokenizer)
    return chosen, tokenizer.for_source(chosen.declared().tokenizer.source_lang)


class LanguageTokenizer(TextTokenizer):
    """A multilingual model's tokenizer: the source language's token before the text (or after its end token), the
    end token after it; output ids back to text with every special token (language codes included) dropped."""

    def __init__(self, declared: TokenizerDeclaration, end: int, pad: int, unk: int, special: set[int]):
        self.declared = declared
        self.languages = dict(declared.languages or {})
        self.source_lang = declared.source_lang
        self.end, self.pad, self.unk = end, pad, unk
        self.special = special | set(self.languages.values()) | {end, pad, unk}

    def for_source(self, code: str) -> LanguageTokenizer:
        other = copy.copy(self)
        other.source_lang = code
        return other

    def _pieces_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def piece(self, token: int) -> str:
        return self.pieces.get(token, "")  # each kind's output pieces by id

    def _ids(self, text: str) -> list[int]:
        if not text:
            return []  # an empty line stays empty
        lang = self.languages[self.source_lang]
        ids = self._pieces_ids(text)
        return ids + [self.end, lang] if self.declared.lang_suffix else [lang] + ids + [self.end]


class SpmVocabTokenizer(LanguageTokenizer):
    """M2M100Tokenizer: SentencePiece pieces looked up in vocab.json (unknown pieces: <unk>), `__en__` tokens after it."""

    def __init__(self, sp: spm.SentencePieceProcessor, vocab: dict[str, int], declared: TokenizerDeclaration, rules):
        super().__init__(declared, rules.end, rules.pad, declared.unk, {vocab.get("<s>", rules.end)})
        self.spm, self.vocab = sp, vocab  # not `sp`: its ids are vocab.json's, not the SentencePiece model's
        self.pieces = {i: p for p, i in vocab.items()}

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, rules) -> SpmVocabTokenizer:
        return cls(_load_spm(directory / declared.source), read_vocab(directory / declared.vocab), declared, rules)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + len(self.languages)

    def _pieces_ids(self, text: str) -> list[int]:
        return [self.vocab.get(p, self.unk) for p in self.spm.encode(text, out_type=str)]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [self.spm.decode([self.pieces[i] for i in seq if i not in self.special and i in self.pieces]).strip() for seq in ids]


# ---- tokenizer.json: untrusted input run by the `tokenizers` library's Rust code -------------------------------------

# The library runs a tokenizer.json's regular expressions (a normalizer's or decoder's Replace, a pre-tokenizer's Split)
# with Oniguruma, a backtracking engine: a group repeated around an alternation or a repetition of its own, as
# `(a|aa)+$`, tries every way to split a run of text between them. Each match attempt stops at Oniguruma's retry limit
# (ten million steps, about 0.2 s), where the library panics; below it, one 3,000-character line took 9 s. So such a
# pattern is refused when the file is read (at export and at every load: a model directory can change after export),
# and a panic left at run time fails its one input in one line.
BOUNDED_REPEATS = 8  # a group with alternatives repeated at most this often tries at most 2**8 splits: harmless
_BOUNDS = re.compile(r"\{(\d*)(,?)(\d*)\}")


def _escape_end(p: str, i: int) -> int:
    r"""The index after the escape at p[i] (a backslash): `\p{L}`, `\x{41}`, `\k<name>` whole, else two characters."""
    if i + 2 < len(p) and p[i + 1] in "pPxoukg" and p[i + 2] in "{<":
        close = p.find("}" if p[i + 2] == "{" else ">", i + 3)
        return len(p) if close < 0 else close + 1
    return i + 2


def _class_end(p: str, i: int) -> int:
    """The index after the character class opening at p[i] ("["), nested classes ([a-z&&[^aeiou]]) included."""
    depth = 0
    while i < len(p):
        if p[i] == "\\":
            i = _escape_end(p, i)
            continue
        if p[i] == "[":
            depth += 1
            i += 1 + (p[i + 1:i + 2] == "^")
            i += p[i:i + 1] == "]"  # a "]" first in a class is itself
            continue
        i += 1
        if p[i - 1] == "]":
            depth -= 1
            if depth == 0:
                return i
    return i


def _quantifier(p: str, i: int) -> tuple[int | None, int] | None:
    """(most repeats, None for no bound; the index after it) of the quantifier at p[i], or None where there is none."""
    if p[i] in "*+":
        most, end = None, i + 1
    elif p[i] == "?":
        most, end = 1, i + 1
    elif (bounds := _BOUNDS.match(p, i)) and (bounds.group(1) or bounds.group(3)):
        least, comma, most_text = bounds.groups()
        most, end = (int(most_text) if most_text else None if comma else int(least)), bounds.end()
    else:
        return None
    return most, end + (p[end:end + 1] in ("?", "+"))  # lazy or possessive


def nested_repetition(pattern: str) -> bool:
    r"""Whether regular expression `pattern` repeats a group (without bound, or more than BOUNDED_REPEATS times) that
    holds an alternation or a repetition: `(a|aa)+`, `(\w+)*`, `(?:x+y?)+`. The plain repetitions tokenizers ship
    (` {2,}`, `\p{L}+`, `[^\s\p{L}\p{N}]+`, `\p{N}{1,3}`) and an unrepeated group of alternatives (`(?i:'s|'t)`) are not."""
    frames = [False]  # per open group: whether it holds an alternation or a repetition so far
    atom: bool | None = None  # what a quantifier here repeats: a group (whether it alternates or repeats), one item, nothing
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "(" and pattern.startswith("(?#", i):  # a comment
            close = pattern.find(")", i)
            i, atom = (len(pattern) if close < 0 else close + 1), None
        elif c == "(":
            frames.append(False)
            i, atom = i + 1 + (pattern[i + 1:i + 2] == "?"), None  # (?:, (?=, (?<name>: the rest reads as plain characters
        elif c == ")":
            atom = frames.pop() if len(frames) > 1 else False
            frames[-1] |= atom
            i += 1
        elif c == "|":
            frames[-1], i, atom = True, i + 1, None
        elif atom is not None and (found := _quantifier(pattern, i)):
            most, i = found
            if atom and (most is None or most > BOUNDED_REPEATS):
                return True
            frames[-1] |= most is None or most > 1
            atom = None
        else:
            i = _escape_end(pattern, i) if c == "\\" else _class_end(pattern, i) if c == "[" else i + 1
            atom = False
    return False


def _regexes(node: object, where: str):
    """(where, pattern) of every regular expression in a tokenizer.json section: a `"pattern": {"Regex": ...}`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Regex" and isinstance(value, str):
                yield where, value
            else:
                yield from _regexes(value, f"{where}.{key}")
    elif isinstance(node, list):
        for k, value in enumerate(node):
            yield from _regexes(value, f"{where}[{k}]")


def regex_problem(tok) -> str | None:
    """What makes a loaded tokenizer.json's regular expressions unsafe to run on any text (nested_repetition), or None.
    Read from its normalizer, pre-tokenizer and decoder: the sections that hold them."""
    for section in ("normalizer", "pre_tokenizer", "decoder"):
        part = getattr(tok, section)
        if part is None:
            continue
        for where, pattern in _regexes(json.loads(part.__getstate__()), section):
            if nested_repetition(pattern):
                shown = json.dumps(pattern)[:80]
                return (f"{where} is the regular expression {shown}, which repeats a group that alternates or repeats "
                        "itself: the tokenizers library can take seconds on one line with it, or fail; write it without "
                        "the nesting ((a|aa)+ is a+), or use the model's own tokenizer.json")
    return None


def rust_panic(e: BaseException) -> bool:
    """Whether `e` is a panic of a Rust extension's code (pyo3's PanicException, which derives from BaseException so
    that `except Exception` misses it)."""
    return type(e).__name__ == "PanicException"


def load_tokenizer_json(path: Path, fix: str):
    """The `tokenizers` library's Tokenizer of an untrusted tokenizer.json, or one line (ending with `fix`) saying why
    not: too large, not one the library loads, or a regular expression that can take it seconds on one line."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        if path.stat().st_size > MAX_VOCAB_BYTES:
            raise UsageError(f"{path} is over {MAX_VOCAB_BYTES >> 20} MB, too large for a tokenizer.json; {fix}")
        tok = RustTokenizer.from_str(path.read_text(encoding="utf-8"))
    except UsageError:
        raise
    except BaseException as e:  # tokenizers raises its own Exception, or panics
        if not isinstance(e, Exception) and not rust_panic(e):
            raise
        raise UsageError(f"{path} is not a tokenizer.json the tokenizers library loads ({first_line(e, 80)}); {fix}") from None
    problem = regex_problem(tok)
    if problem:
        raise UsageError(f"{path}: {problem}")
    return tok


def _tokenizers_call(run, path: Path, text: str):
    """run(), a call into the tokenizers library on `text`, with a panic of its Rust code as one line naming the file
    and the text: that one input fails (tk translate exits with it, tk serve answers it), never the process or the
    server's decoding worker."""
    try:
        return run()
    except BaseException as e:
        if not rust_panic(e):
            raise
        raise DataError(f"tokenizer {path} failed on the text {text[:40]!r}{'...' if len(text) > 40 else ''} "
                        f"({first_line(e, 100)}); fix its regular expressions, or re-export the model with the model's "
                        "own tokenizer.json") from None


def json_encode(tok, text: str, path: Path, special: bool = False) -> list[int]:
    """The ids of `text` by a tokenizer.json, its post-processor's special tokens added only when `special` (a panic:
    _tokenizers_call)."""
    return _tokenizers_call(lambda: tok.encode(text, add_special_tokens=special).ids, path, text)


def json_decode(tok, ids: list[int], path: Path) -> str:
    """The text of `ids` by a tokenizer.json, special tokens dropped (a panic: _tokenizers_call)."""
    return _tokenizers_call(lambda: tok.decode(ids, skip_special_tokens=True), path, " ".join(map(str, ids)))


class JsonTokenizer(LanguageTokenizer):
    """A tokenizer.json (NLLB's), run by the `tokenizers` library with no special tokens of its own; the language code
    and end token placed as the model's tokenizer places them (a model without language codes: as the file's own
    post-processor places its special tokens, `<s> text </s>` in a byte-level BPE's)."""

    def __init__(self, tok, declared: TokenizerDeclaration, rules, path: Path | None = None):
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}  # an AddedToken has no id of its own
        super().__init__(declared, rules.end, rules.pad, declared.unk, special)
        self.tok, self.path = tok, path or Path(declared.source)
        self.pieces = {i: p for p, i in tok.get_vocab(with_added_tokens=True).items()}
        if type(tok.pre_tokenizer).__name__ == "ByteLevel":  # GPT-2's byte-level BPE writes a word's leading space "Ġ"
            self.pieces = {i: WORD_START + p[1:] if p[:1] == "\u0120" else p for i, p in self.pieces.items()}

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, rules) -> JsonTokenizer:
        path = directory / declared.source
        return cls(load_tokenizer_json(path, "re-export the model directory"), declared, rules, path)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def _pieces_ids(self, text: str) -> list[int]:
        return json_encode(self.tok, text, self.path)

    def _ids(self, text: str) -> list[int]:
        if self.languages or not text:
            return super()._ids(text)
        return json_encode(self.tok, text, self.path, special=True)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [json_decode(self.tok, [i for i in seq if i not in self.special], self.path).strip() for seq in ids]


FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's ids 0 to 3


class FairseqSpmTokenizer(LanguageTokenizer):
    """mBART's sentencepiece.bpe.model (MBartTokenizer, MBart50Tokenizer): fairseq's ids, the
    SentencePiece model's shifted by one (fairseq puts <s> 0, <pad> 1, </s> 2, <unk> 3 first; the SentencePiece
    model's own <unk>, id 0, is fairseq's 3), the language codes after the pieces, then <mask>."""

    def __init__(self, sp: spm.SentencePieceProcessor, declared: TokenizerDeclaration, rules):
        self.size = sp.get_piece_size()
        mask = self.size + 1 + len(declared.languages or {})
        super().__init__(declared, rules.end, rules.pad, declared.unk, {0, mask})
        self.spm = sp

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, rules) -> FairseqSpmTokenizer:
        return cls(_load_spm(directory / declared.source), declared, rules)

    @property
    def vocab_size(self) -> int:
        return self.size + 1 + len(self.languages) + 1

    def _pieces_ids(self, text: str) -> list[int]:
        return [i + 1 if i else self.unk for i in self.spm.encode(text)]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [self.spm.decode([i - 1 for i in seq if i not in self.special and 1 <= i - 1 < self.size]).strip() for seq in ids]

    def piece(self, token: int) -> str:
        """fairseq's first four ids are its special tokens; from 4 on, a piece's id is the SentencePiece model's plus one
        (the model's own <s> and </s>, ids 1 and 2, would be 2 and 3, which fairseq's take); the language codes and
        <mask> after the pieces have none."""
        if 0 <= token < len(FAIRSEQ_SPECIALS):
            return FAIRSEQ_SPECIALS[token]
        return self.spm.id_to_piece(token - 1) if len(FAIRSEQ_SPECIALS) <= token <= self.size else ""


# ---- T5: no language codes, a task prefix on the source ("translate English to French: ") --------------------------

SENTINEL = re.compile(r"<extra_id_(\d{1,4})>")  # T5Tokenizer's added tokens: one id each, never split

def t5_pair(m, source_lang: str | None, target_lang: str | None):
    """The manifest `m` with the pair whose task prefix goes before every source (toolkit.pytorch.hf_t5): the pair
    given, or the one `tk export --source-lang/--target-lang` recorded. One line, listing the pairs the model's
    config.json declares, for a pair it has no prefix for or for half a pair."""
    declared = m.declared().tokenizer
    if source_lang is None and target_lang is None:
        return m
    source, target = source_lang or declared.source_lang, target_lang or declared.target_lang
    pairs = ", ".join(sorted(declared.prefixes or {})) or "none"
    if source is None or target is None:
        raise UsageError(f"{m.directory} is a T5: it picks its task prefix by the pair, so give both --source-lang and "
                         f"--target-lang (its config.json declares {pairs})")
    if f"{source}-{target}" not in (declared.prefixes or {}):
        raise UsageError(f"{m.directory} is a T5 with no task prefix for {source} to {target}; its config.json's "
                         f"task_specific_params declares {pairs}")
    if (source, target) == (declared.source_lang, declared.target_lang):
        return m
    chosen = copy.copy(m)
    chosen.declaration = {**m.declaration, "tokenizer": {**m.declaration["tokenizer"], "source_lang": source, "target_lang": target}}
    chosen.__dict__.pop("_declared", None)
    return chosen


class T5SourceTokenizer(TextTokenizer):
    """T5Tokenizer's ids and text without transformers: the chosen pair's task prefix before the text, SentencePiece's
    (spiece.model, whose ids are the model's) or the tokenizers library's (tokenizer.json) pieces, </s> after; output
    ids back to text with <pad>, </s>, <unk> and the <extra_id_N> sentinels dropped, as skip_special_tokens does."""

    def __init__(self, declared: TokenizerDeclaration, rules, sp: spm.SentencePieceProcessor | None = None, tok=None,
                 path: Path | None = None):
        self.declared, self.spm, self.tok = declared, sp, tok  # not `sp`: tk's SentencePiece tokenizer's
        self.path = path or Path(declared.source)
        self.end, self.pad, self.unk = rules.end, rules.pad, declared.unk
        self.prefix = self._prefix(declared)
        self.extra = declared.extra_ids
        if tok is not None:
            self.special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special} | {self.end, self.pad, self.unk}
            self.size = tok.get_vocab_size(with_added_tokens=True)
            self.pieces = {i: p for p, i in tok.get_vocab(with_added_tokens=True).items()}
        else:
            self.special = {self.end, self.pad, self.unk}
            self.size = sp.get_piece_size()
            self.pieces = {i: sp.id_to_piece(i) for i in range(self.size)}

    @staticmethod
    def _prefix(declared: TokenizerDeclaration) -> str:
        pair = f"{declared.source_lang}-{declared.target_lang}"
        return (declared.prefixes or {}).get(pair, "") if declared.source_lang is not None else ""

    @classmethod
    def load(cls, directory: Path, declared: TokenizerDeclaration, rules) -> T5SourceTokenizer:
        if declared.source.endswith(".json"):
            path = directory / declared.source
            return cls(declared, rules, tok=load_tokenizer_json(path, "re-export the model directory"), path=path)
        return cls(declared, rules, sp=_load_spm(directory / declared.source))

    def for_pair(self, declared: TokenizerDeclaration) -> T5SourceTokenizer:
        other = copy.copy(self)
        other.declared, other.prefix = declared, self._prefix(declared)
        return other

    @property
    def vocab_size(self) -> int:
        return self.size + (self.extra if self.tok is None else 0)  # tokenizer.json counts its sentinels itself

    def _ids(self, text: str) -> list[int]:
        if not text:
            return []  # an empty line stays empty
        text = self.prefix + text
        if self.tok is not None:
            return json_encode(self.tok, text, self.path) + [self.end]
        ids, start = [], 0
        for found in SENTINEL.finditer(text):  # each sentinel one id, the text between encoded apart, as T5Tokenizer
            n = int(found.group(1))
            if n < self.extra:  # a number past the sentinels is plain text
                ids += self.spm.encode(text[start:found.start()]) + [self.size + self.extra - 1 - n]
                start = found.end()
        return ids + self.spm.encode(text[start:]) + [self.end]

    def decode(self, ids: list[list[int]]) -> list[str]:
        if self.tok is not None:
            return [json_decode(self.tok, [i for i in seq if i not in self.special], self.path).strip() for seq in ids]
        # ids past the SentencePiece model are the sentinels T5Tokenizer adds after it
        return [self.spm.decode([i for i in seq if i not in self.special and 0 <= i < self.size]).strip() for seq in ids]

    def piece(self, token: int) -> str:
        return self.pieces.get(token, "")


def declaration_stating(declaration: dict, source: str, target: str, where: str) -> dict:
    """The declaration `declaration` stating the pair a one-pair model translates, or a multilingual model's default
    pair (its own codes: en -> __en__'s), checked: an unknown code, or a T5 pair without a task prefix, is one line.
    The one place a pair is stated: `tk export --source-lang/--target-lang` checks it with this before any export work
    and records it with state_languages."""
    declaration = dict(declaration or Declaration().to_dict())
    tokenizer = dict(declaration.get("tokenizer", {}))
    codes, decoding = tokenizer.get("languages"), declaration.get("decoding", {})
    if isinstance(codes, dict):
        declared = Declaration.from_dict(declaration, where).tokenizer
        source, target = language_id(declared, source, "source"), language_id(declared, target, "target")
    tokenizer.update(source_lang=source, target_lang=target)
    if isinstance(codes, dict) and target in codes and decoding.get("forced_first") is not None:
        # A multilingual model's new default target is the token forced first: left as it was, the recorded pair
        # would tokenize the new source and still translate into the old target. (A model that forces none, whose
        # start token is its target's, gets it from toolkit.core.tokenizers.choose_languages each time.)
        declaration["decoding"] = {**decoding, "forced_first": codes[target]}
    Declaration.from_dict({**declaration, "tokenizer": tokenizer}, where)  # checked (a T5's task prefix for the pair)
    return {**declaration, "tokenizer": tokenizer}


def state_languages(directory: str | Path, source: str, target: str) -> tuple[str, str]:
    """Records the pair (declaration_stating) in the directory's declaration: tk serve routes requests by it and
    --source-lang checks it. Returns the pair in the model's own codes."""
    from toolkit.core.manifest import NAME, updating

    with updating(directory) as m:
        m.declaration = declaration_stating(m.declaration, source, target, str(Path(directory) / NAME))
        m.__dict__.pop("_declared", None)
        tokenizer = m.declaration["tokenizer"]
        return tokenizer["source_lang"], tokenizer["target_lang"]
