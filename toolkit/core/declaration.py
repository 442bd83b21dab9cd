"""A translation model's own rules, declared once with the model and stored in its manifest ("declaration").

What the graphs alone do not say and every runtime must follow the same way: which token starts the decoder and
which ends it, what the length penalty of beam search is, whether the last step may emit only the end token, how
long an output may be unless told, and which tokenizer turns text into the graphs' ids. tk's own models (Transformer,
GRU seq2seq) declare tk's rules; a model imported from Hugging Face declares the rules of its generation config, so
that tk decodes it the way `generate` does. Standard library only: the CLI and the decoding loop read it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from toolkit.core.errors import UsageError

# tk's tokenizer ids (toolkit.core.tokenizer), repeated here so that this module imports nothing.
TK_PAD, TK_UNK, TK_BOS, TK_EOS = 0, 1, 2, 3

PENALTIES = ("gnmt", "hf")
# A language code as users type it: en, pt-BR, zh-Hans, eng_Latn, fr_XX.
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:[-_](?:[A-Z][a-z]{3}|[A-Z]{2}|[A-Z][a-z]{3}))?")
# Where a model comes from (the declaration's "origin"): trained by tk, imported from a Hugging Face directory, or
# your own code (whose architecture, toolkit.core.entries.adapter, bears the same name).
TK, HF, ADAPTER = "tk", "hf", "adapter"
ORIGINS = (TK, HF, ADAPTER)


@dataclass(frozen=True)
class TokenizerKind:
    """One kind of tokenizer a declaration may name: `loader` ("module:callable") opens it as
    loader(directory, declared, rules); `needs_vocab`: its pieces are looked up in a vocab file; `task_prefixes`: a
    pair is chosen by a task prefix on the source (T5), not by language codes."""

    loader: str | None = None  # None: tk's SentencePiece model (toolkit.core.tokenizers.open_tokenizer)
    needs_vocab: bool = False
    task_prefixes: bool = False


# Every kind a declaration may name: here those more than one architecture ships with ("words": a word-level
# vocabulary, toolkit.core.word_vocab; "tokenizer.json": the tokenizers library's); a kind only one architecture uses
# is declared by its entry (own_tokenizers) and added here when it registers (toolkit.core.architectures).
TOKENIZERS = {"sentencepiece": TokenizerKind(), "tokenizer.json": TokenizerKind("toolkit.core.tokenizers:JsonTokenizer.load"),
              "words": TokenizerKind("toolkit.core.tokenizers:word_tokenizer")}


@dataclass(frozen=True)
class DecodingRules:
    """How a model is decoded, whatever runs its graphs.

    length_penalty "gnmt": beam search keeps a sentence's first `beam` finished hypotheses and ranks them by
    score / ((5 + n + 1) / 6) ** alpha (tk's rule). "hf": Hugging Face's beam search, to the token: the 2 x beam best
    continuations each step, a finished hypothesis ranked by score / n ** alpha (n: tokens generated, the end token
    included) and kept among the `beam` best, and a sentence done when its best live score cannot beat its worst
    finished one (`early_stopping` False), when `beam` are finished (True), or never before the limit ("never").
    """

    start: int = TK_BOS  # the decoder's first input
    end: int = TK_EOS  # ends a hypothesis; never part of the output text
    pad: int = TK_PAD  # pads source batches (the graphs mask it by src_len)
    length_penalty: str = "gnmt"
    alpha: float = 0.6  # the length penalty's exponent unless the caller gives one
    early_stopping: bool | str = False  # "hf" only
    forced_end: bool = False  # the last step of the length limit emits the end token (HF forced_eos_token_id)
    max_new_tokens: int | None = None  # output tokens unless the caller gives a limit (None: the model's positions)
    # The first output token is this one, whatever the model says (HF forced_bos_token_id: a multilingual model's target
    # language token); it counts as an output token and adds nothing to the score, as in generate. None: none forced.
    forced_first: int | None = None

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise UsageError(f"declaration.decoding: {problem}; re-export the model directory")

    def problem(self) -> str | None:
        for name in ("start", "end", "pad"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return f"{name} must be a token id (a whole number of at least 0), got {value!r}"
        if self.length_penalty not in PENALTIES:
            return f"length_penalty must be one of {', '.join(PENALTIES)}, got {self.length_penalty!r}"
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not -10.0 <= self.alpha <= 10.0:
            return f"alpha must be a number from -10 to 10, got {self.alpha!r}"
        if self.early_stopping not in (True, False, "never"):
            return f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}"
        if not isinstance(self.forced_end, bool):
            return f"forced_end must be true or false, got {self.forced_end!r}"
        if self.forced_first is not None and (not isinstance(self.forced_first, int) or isinstance(self.forced_first, bool)
                                              or self.forced_first < 0):
            return f"forced_first must be a token id or null, got {self.forced_first!r}"
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool)
                                                or not 1 <= self.max_new_tokens <= 4096):
            return f"max_new_tokens must be a whole number from 1 to 4096, got {self.max_new_tokens!r}"
        return None

    def normalized(self, score: float, tokens: int, alpha: float, ended: bool = True) -> float:
        """A finished hypothesis's ranking score: its summed log-probability over its length penalty.
        `tokens`: output tokens, the end token not counted; `ended`: it emitted the end token."""
        if self.length_penalty == "hf":
            return score / max(1, tokens + int(ended)) ** alpha
        return score / (((5 + tokens + 1) / 6) ** alpha)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str) -> DecodingRules:
        return _section(cls, data, where, "decoding", "a decoding rule")


TK_RULES = DecodingRules()


def layer_key(name: str, layer: int) -> str:
    """The name of layer `layer`'s tensor in tk's cache layout: one tensor per layer (self_k_0, cross_v_1), not stacked,
    so the exported decoder never splits and re-stacks the whole cache on every step."""
    return f"{name}_{layer}"


def transformer_layers(config: dict) -> tuple[int, int]:
    """(encoder layers, decoder layers) of a tk Transformer's config: `decoder_layers` where the config states it,
    else `num_layers` for both (manifests and checkpoints written before the two could differ)."""
    decoder = config.get("decoder_layers")
    return config["num_layers"], config["num_layers"] if decoder is None else decoder


def self_attention_cache(layers: int) -> set[str]:
    """The decoder cache of an attention encoder-decoder in tk's layout: a key and a value tensor per layer."""
    return {layer_key(f"self_{kv}", i) for i in range(layers) for kv in "kv"}


@dataclass(frozen=True)
class TokenizerDeclaration:
    """Which tokenizer turns text into the graphs' ids. "sentencepiece": one SentencePiece model whose ids are the
    graphs' (tk's, shared by both languages). "marian": Hugging Face's MarianTokenizer layout, a SentencePiece model per
    side whose pieces are looked up in vocab.json (target_vocab.json when the sides do not share one), the end token
    appended to every source."""

    kind: str = "sentencepiece"
    source: str = "tokenizer.model"  # files in the model directory
    target: str | None = None  # None: the source's
    vocab: str | None = None  # a kind that needs_vocab: pieces -> ids
    target_vocab: str | None = None  # the same, when the sides have separate vocabularies
    unk: int = TK_UNK
    # A multilingual model's language codes (the code users type, "en" or "eng_Latn") -> the token that marks it, the
    # defaults its own files name, and where the source's code goes: before the text (M2M100, NLLB) or after its end
    # token (NLLB's legacy behaviour, mBART).
    languages: dict | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    lang_suffix: bool = False
    # The end token appended to every source (a model trained on `text </s>`, as d2l's and Marian's are); tk's own
    # SentencePiece models append none. Marian's layout always appends it, whatever this says.
    source_end: bool = False
    # A T5's task prefixes (a kind of task_prefixes): "en-fr" -> "translate English to French: ", from config.json's
    # task_specific_params; the chosen pair's prefix goes before every source (none when no pair is chosen).
    prefixes: dict | None = None
    # T5Tokenizer's <extra_id_N> sentinels after a spiece.model's pieces (N = 0 the last id), kept whole in the text
    extra_ids: int = 0

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZERS:
            raise UsageError(f"declaration.tokenizer.kind must be one of {', '.join(TOKENIZERS)}, got {self.kind!r}; re-export")
        for name in ("source", "target", "vocab", "target_vocab"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "/" in value or "\\" in value or value in ("", ".", "..")):
                raise UsageError(f"declaration.tokenizer.{name} must be a file name inside the model directory, got {value!r}; re-export")
        if TOKENIZERS[self.kind].needs_vocab and self.vocab is None:
            raise UsageError(f"declaration.tokenizer: a {self.kind} tokenizer needs its vocab file; re-export")
        if not isinstance(self.source_end, bool):
            raise UsageError(f"declaration.tokenizer.source_end must be true or false, got {self.source_end!r}; re-export")
        if type(self.extra_ids) is not int or not 0 <= self.extra_ids <= 1000:
            raise UsageError(f"declaration.tokenizer.extra_ids must be a whole number from 0 to 1000, got {self.extra_ids!r}; re-export")
        if self.prefixes is not None or TOKENIZERS[self.kind].task_prefixes:
            t5 = _t5_prefixes_problem(self.prefixes, self.source_lang, self.target_lang)
            if t5:
                raise UsageError(f"declaration.tokenizer.{t5}")
        problem = self._languages_problem()
        if problem:
            raise UsageError(f"declaration.tokenizer.{problem}; re-export")

    def _languages_problem(self) -> str | None:
        if self.languages is None:  # a model of one pair: its two codes, stated together (tk export --source-lang ...)
            if self.source_lang is None and self.target_lang is None:
                return None
            codes = (self.source_lang, self.target_lang)
            if not all(isinstance(c, str) and LANGUAGE_CODE.fullmatch(c) for c in codes) or codes[0] == codes[1]:
                return f"source_lang and target_lang must be two different language codes together, got {codes!r}"
            return None
        if not isinstance(self.languages, dict) or not self.languages or not all(
                isinstance(k, str) and k and type(v) is int and v >= 0 for k, v in self.languages.items()):
            return "languages must map language codes to token ids"
        for name in ("source_lang", "target_lang"):
            if getattr(self, name) not in self.languages:
                return f"{name} must be one of the languages, got {getattr(self, name)!r}"
        if not isinstance(self.lang_suffix, bool):
            return "lang_suffix must be true or false"
        return None

    def served(self) -> dict[str, list[str]] | None:
        """The language codes this model translates from and into: every code of a multilingual model, the stated pair
        of a one-pair model, None for a one-pair model that states none."""
        if self.languages is None:
            return None if self.source_lang is None else {"source": [self.source_lang], "target": [self.target_lang]}
        return {"source": sorted(self.languages), "target": sorted(self.languages)}

    def files(self) -> list[str]:
        return list(dict.fromkeys(f for f in (self.source, self.target, self.vocab, self.target_vocab) if f is not None))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str) -> TokenizerDeclaration:
        return _section(cls, data, where, "tokenizer", "a tokenizer field")


def _t5_prefixes_problem(prefixes: object, source: str | None, target: str | None) -> str | None:
    """A T5's prefixes (pair -> text) and, when a pair is stated, that the prefixes name it (none would translate)."""
    if not isinstance(prefixes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prefixes.items()):
        return "prefixes must map language pairs (en-fr) to task prefixes; re-export"
    if source is not None and target is not None and f"{source}-{target}" not in prefixes:
        return (f"source_lang/target_lang: this T5 has no task prefix for {source} to {target}; config.json's "
                f"task_specific_params declares {', '.join(sorted(prefixes)) or 'none'}")
    return None

def _section(cls, data: object, where: str, section: str, noun: str):
    """One section of the declaration from JSON: an object of known fields, each checked by the class itself."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: declaration.{section} must be an object; re-export the model directory")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{where}: declaration.{section}.{unknown[0]} is not {noun} (known: {', '.join(sorted(known))})")
    try:
        return cls(**data)
    except (UsageError, TypeError) as e:
        raise UsageError(f"{where}: {e}") from None


@dataclass(frozen=True)
class Declaration:
    """The manifest's "declaration": the decoding rules and the tokenizer; the graphs' interface is in "graphs"."""

    decoding: DecodingRules = TK_RULES
    tokenizer: TokenizerDeclaration = TokenizerDeclaration()
    origin: str = TK  # one of ORIGINS
    # Trained to copy placeholder symbols and to see all-caps text lower-cased (tk's training noise): then tk protects
    # numbers, URLs and --keep terms with placeholders and folds the case of shouted lines. Another model gets the
    # text as it is, cleaned and split into sentences.
    placeholders: bool = True

    def to_dict(self) -> dict:
        return {"decoding": self.decoding.to_dict(), "tokenizer": self.tokenizer.to_dict(), "origin": self.origin,
                "placeholders": self.placeholders}

    @classmethod
    def from_dict(cls, data: object, where: str) -> Declaration:
        if not isinstance(data, dict) or set(data) - {"decoding", "tokenizer", "origin", "placeholders"}:
            raise UsageError(f"{where}: 'declaration' must be an object of decoding, tokenizer, origin and placeholders; re-export")
        origin = data.get("origin", TK)
        if origin not in ORIGINS:
            raise UsageError(f"{where}: declaration.origin must be {', '.join(ORIGINS[:-1])} or {ORIGINS[-1]}, got {origin!r}; re-export")
        placeholders = data.get("placeholders", origin == TK)
        if not isinstance(placeholders, bool):
            raise UsageError(f"{where}: declaration.placeholders must be true or false; re-export")
        return cls(DecodingRules.from_dict(data.get("decoding", {}), where),
                   TokenizerDeclaration.from_dict(data.get("tokenizer", {}), where), origin, placeholders)
