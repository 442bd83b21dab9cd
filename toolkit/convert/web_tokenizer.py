"""The site's tokenizer for a model directory (`tk export DIR --web SITE`): what the page needs to give the ids and text
`open_tokenizer(m)` gives.

tk's own SentencePiece models keep tokenizer.mjs, the exact port of sentencepiece (toolkit.convert.web.tokenizer_json).
Every imported tokenizer is written as a tokenizer.json that @huggingface/tokenizers (vendored into the site) runs:
a tokenizer.json the directory ships, as it is but for its normaliser; a SentencePiece model (Marian, M2M100, mBART,
T5), converted with the `tokenizers` package as transformers' convert_slow_tokenizer.py does, at the graph's ids. What
goes around the pieces (the end token, the source language's token, T5's task prefix) is model.json's tokenizer entry,
read from the same declaration the Python tokenizer reads.

The JavaScript library's Precompiled normaliser does not read the character map: it removes and maps the characters
sentencepiece's nmt_nfkc rule names, then applies NFKC. So every Precompiled normaliser is written as those same steps
in the `tokenizers` package's own terms, which both libraries run alike; `site_ids` runs the written file in Python, so
the writer's verify stage holds the browser's rule to the directory's tokenizer on its texts.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.core import manifest as manifest_mod
from toolkit.core.errors import UsageError
from toolkit.core.tokenizers import (
    FairseqSpmTokenizer,
    JsonTokenizer,
    MarianTokenizer,
    SpmVocabTokenizer,
    T5SourceTokenizer,
    open_tokenizer,
    read_vocab,
)

WORD = "\u2581"
UNREACHABLE = "\u0001"  # a piece the page must decode but never match: the normaliser removes U+0001 from every text
# sentencepiece's nmt_nfkc rule (normalization_rule.tsv), as @huggingface/tokenizers' Precompiled applies it.
NMT_CONTROLS = "[\u0001-\u0008\u000b\u000e-\u001f\u007f\u008f\u009f]"
# Unlike that library's list: U+061C (ARABIC LETTER MARK) is a space and U+200D (ZERO WIDTH JOINER, inside emoji) kept,
# as the character maps sentencepiece writes have them.
NMT_SPACES = "[\u0009\u000a\u000c\u000d\u00a0\u061c\u1680\u2000-\u200c\u200e\u200f\u2028\u2029\u202f\u205f\u2581\u3000\ufeff\ufffd]"
FULLWIDTH_TILDE, KEPT = "\uff5e", "\ufdd0"  # nmt_nfkc keeps U+FF5E, which NFKC makes "~": parked in a noncharacter


def _nmt_nfkc() -> list[dict]:
    """nmt_nfkc as the tokenizers package's normalisers (JSON): what both libraries run identically."""
    replace = lambda pattern, content: {"type": "Replace", "pattern": pattern, "content": content}  # noqa: E731
    return [replace({"Regex": NMT_CONTROLS}, ""), replace({"Regex": NMT_SPACES}, " "),
            replace({"String": FULLWIDTH_TILDE}, KEPT), {"type": "NFKC"}, replace({"String": KEPT}, FULLWIDTH_TILDE)]


def portable(node):
    """A tokenizer.json's section with every Precompiled normaliser written as _nmt_nfkc's steps."""
    if isinstance(node, dict):
        if node.get("type") == "Precompiled":
            return {"type": "Sequence", "normalizers": _nmt_nfkc()}
        return {k: portable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [portable(v) for v in node]
    return node


def spm_tokenizer_json(proto_bytes: bytes, path: Path, ids: dict[str, int], size: int, added: dict[int, str]) -> dict:
    """A SentencePiece model as a tokenizer.json at the graph's ids: piece -> `ids[piece]` (the model's pieces it
    lacks are not matched), every other id up to `size` a piece the text never matches (UNREACHABLE + its name, which the
    decoder drops), `added` ids kept whole in the text (T5's sentinels). Normalisation as sentencepiece's spec says
    (nmt_nfkc or identity; extra whitespace removed; the dummy prefix), SentencePiece's decoding."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    try:
        proto.ParseFromString(proto_bytes)
    except Exception as e:  # a truncated or foreign file: protobuf raises DecodeError
        raise UsageError(f"tokenizer {path} is unreadable or corrupt ({type(e).__name__}); re-export the model directory") from None
    norm, spec = proto.normalizer_spec, proto.trainer_spec
    if norm.precompiled_charsmap and norm.name != "nmt_nfkc":
        raise UsageError(f"tokenizer {path} uses the '{norm.name}' normalisation rule; the browser site supports nmt_nfkc and identity")
    kind = pb.ModelProto.SentencePiece
    names = {i: f"{UNREACHABLE}{name}" for i, name in added.items()}
    vocab: list[list] = [[names.get(i, f"{UNREACHABLE}{i}"), 0.0] for i in range(size)]
    for p in proto.pieces:
        i = ids.get(p.piece)
        if i is not None and p.type in (kind.NORMAL, kind.USER_DEFINED, kind.BYTE) and i < size:
            vocab[i] = [p.piece, p.score]
    steps = _nmt_nfkc() if norm.precompiled_charsmap else []
    if norm.remove_extra_whitespaces:
        # spaces only: Strip would take tabs and line breaks too, which an identity rule keeps as text
        steps += [{"type": "Replace", "pattern": {"Regex": " +"}, "content": " "},
                  {"type": "Replace", "pattern": {"Regex": "\\A | \\z"}, "content": ""}]
    if not norm.precompiled_charsmap and norm.remove_extra_whitespaces and norm.add_dummy_prefix:
        # "▁" typed in the text stays one (nmt_nfkc makes it a space): sentencepiece strips it at the end with the
        # spaces, and puts the dummy prefix even before a leading one, which Metaspace does not (as toolkit.convert.to_hf)
        steps += [{"type": "Replace", "pattern": {"Regex": "[ ▁]+\\z"}, "content": ""},
                  {"type": "Replace", "pattern": {"Regex": "\\A▁"}, "content": "▁▁"}]
    unk = ids.get(next((p.piece for p in proto.pieces if p.type == kind.UNKNOWN), "<unk>"), spec.unk_id)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, name in added.items()],
        "normalizer": {"type": "Sequence", "normalizers": steps},
        # one chunk (split false): sentencepiece's Viterbi runs over the whole text
        "pre_tokenizer": {"type": "Metaspace", "replacement": WORD, "split": False,
                          "prepend_scheme": "always" if norm.add_dummy_prefix else "never"},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": UNREACHABLE}, "content": ""},
            {"type": "Replace", "pattern": {"String": WORD}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "Unigram", "unk_id": unk, "vocab": vocab, "byte_fallback": spec.byte_fallback},
    }


def _marian_json(d: Path, model_file: str, vocab_file: str) -> dict:
    """A Marian SentencePiece model as a tokenizer.json at its vocabulary's ids (the source's, or the target's to decode
    output ids with when the two vocabularies are separate)."""
    vocab = read_vocab(d / vocab_file)
    data = spm_tokenizer_json((d / model_file).read_bytes(), d / model_file, vocab, len(vocab), {})
    pieces = data["model"]["vocab"]
    known = {p for p, _ in pieces if len(p) == 1}
    for piece, i in vocab.items():  # the target's pieces: decoded, and never matched in a source ...
        if pieces[i][0].startswith(UNREACHABLE):
            # ... but for a character the source model lacks: SentencePiece gives its text, which vocab.json has
            reachable = len(piece) == 1 and piece not in known and piece != WORD
            pieces[i][0] = piece if reachable else f"{UNREACHABLE}{piece}"
    return data


def site_tokenizer(m: manifest_mod.Manifest) -> tuple[dict, dict] | None:
    """(tokenizer.json, model.json's tokenizer entry) for an imported tokenizer; None for tk's own SentencePiece kind
    (tokenizer.mjs). A kind the page cannot run is one line."""
    declared, rules = m.declared().tokenizer, m.rules()
    d = m.directory
    tokenizer = open_tokenizer(m)
    entry = {"kind": "tokenizers", "end": None, "languages": None, "source_lang": declared.source_lang,
             "target_lang": declared.target_lang, "lang_suffix": declared.lang_suffix, "prefixes": None,
             "special": sorted(getattr(tokenizer, "special", ())), "post_processor": False, "unk": declared.unk}
    source = d / declared.source
    if isinstance(tokenizer, JsonTokenizer) or (isinstance(tokenizer, T5SourceTokenizer) and tokenizer.tok is not None):
        data = portable(json.loads(source.read_text(encoding="utf-8")))  # read with tk's checks of a hostile file
    elif isinstance(tokenizer, MarianTokenizer):
        data = _marian_json(d, declared.source, declared.vocab)
        if declared.target_vocab:  # output ids are the target vocabulary's: the page decodes them with its own file
            entry["target"] = _marian_json(d, declared.target or declared.source, declared.target_vocab)
        elif declared.target and (d / declared.target).read_bytes() != source.read_bytes():
            # A glossary's targets are written by the target's SentencePiece model (MarianTokenizer.target_ids).
            entry["target_ids"] = _marian_json(d, declared.target, declared.vocab)
    elif isinstance(tokenizer, SpmVocabTokenizer):
        vocab = read_vocab(d / declared.vocab)
        size = max([*vocab.values(), *(declared.languages or {}).values()]) + 1
        data = spm_tokenizer_json(source.read_bytes(), source, vocab, size, {})
    elif isinstance(tokenizer, FairseqSpmTokenizer):
        ids = {tokenizer.spm.id_to_piece(i): i + 1 for i in range(1, tokenizer.size)}  # fairseq's offset of one
        data = spm_tokenizer_json(source.read_bytes(), source, ids, tokenizer.vocab_size, {})
        data["model"]["unk_id"] = declared.unk
    elif isinstance(tokenizer, T5SourceTokenizer):
        sp = tokenizer.spm
        sentinels = {tokenizer.size + declared.extra_ids - 1 - n: f"<extra_id_{n}>" for n in range(declared.extra_ids)}
        data = spm_tokenizer_json(source.read_bytes(), source, {sp.id_to_piece(i): i for i in range(tokenizer.size)},
                                  tokenizer.size, {})
        data["added_tokens"] = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": True} for i, name in sorted(sentinels.items())]
        data["model"]["vocab"] += [[sentinels[i], 0.0] for i in range(tokenizer.size, tokenizer.size + declared.extra_ids)]
        entry["special"] = sorted({*entry["special"], *sentinels})  # T5Tokenizer's decode drops them
    else:
        return None
    if isinstance(tokenizer, (MarianTokenizer, T5SourceTokenizer)) or declared.source_end:
        entry["end"] = rules.end
    if getattr(tokenizer, "languages", None):
        entry["languages"] = dict(tokenizer.languages)
        entry["end"] = rules.end
    elif isinstance(tokenizer, JsonTokenizer):
        entry["post_processor"] = True  # the file's own special tokens around the pieces (JsonTokenizer._ids)
    if isinstance(tokenizer, T5SourceTokenizer):
        entry["prefixes"] = declared.prefixes or {}
    return data, entry


def site_ids(data: dict, entry: dict, texts: list[str], source_lang: str | None = None) -> list[list[int]]:
    """The ids the page gives `texts` with this tokenizer.json and entry, run by the tokenizers package: the page's
    rule (toolkit/web/site/tokenizers.mjs) in Python, which the verify stage holds to the directory's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(data))
    out = []
    lang = source_lang or entry["source_lang"]
    prefix = (entry["prefixes"] or {}).get(f"{entry['source_lang']}-{entry['target_lang']}", "") if entry["prefixes"] else ""
    for text in texts:
        if not text:
            out.append([])
            continue
        if entry["post_processor"]:
            out.append(tok.encode(text).ids)
            continue
        code = []
        if entry["end"] is not None and not entry["languages"] and text.startswith(">>") and "<<" in text:
            stop = text.find("<<") + 2  # Marian's target-language code, one token
            found = tok.token_to_id(text[:stop])
            code, text = [entry["unk"] if found is None else found], text[stop:]
        ids = tok.encode(prefix + text, add_special_tokens=False).ids
        if entry["languages"]:
            lang_id = entry["languages"][lang]
            ids = ids + [entry["end"], lang_id] if entry["lang_suffix"] else [lang_id, *ids, entry["end"]]
        elif entry["end"] is not None:
            ids = code + ids + [entry["end"]]
        out.append(ids)
    return out


def site_tokenizer_problem(m: manifest_mod.Manifest, data: dict, entry: dict) -> str | None:
    """What the written tokenizer.json and entry do otherwise than the directory's tokenizer on the normalisation texts
    `tk export --to-hf` checks (whitespace runs and kinds, NFKC's characters, accents, emoji): another file than this
    export writes, other ids, or another text back from those ids; None when they agree."""
    from tokenizers import Tokenizer

    from toolkit.convert.to_hf import NORMALIZATION_TEXTS

    written = site_tokenizer(m)
    if written is None or written != (data, {k: v for k, v in entry.items() if k != "file"}):
        return "tokenizer.json is not the directory's tokenizer"
    labels, texts = zip(*NORMALIZATION_TEXTS)
    tokenizer = open_tokenizer(m)
    want, got = tokenizer.encode(list(texts)), site_ids(data, entry, list(texts))
    differ = [label for label, a, b in zip(labels, want, got) if a != b]
    if differ:
        return f"the site's tokenizer gives other ids than the directory's ({differ[0]})"
    if entry.get("target_ids"):  # a glossary's targets' ids, as the page writes them
        terms = Tokenizer.from_str(json.dumps(entry["target_ids"]))
        if tokenizer.target_ids(list(texts)) != [terms.encode(t, add_special_tokens=False).ids for t in texts]:
            return "the site's target tokenizer gives other ids than the directory's"
    # output ids: the target vocabulary's when it is another (decoded with the entry's own tokenizer.json)
    out = tokenizer.target_ids(list(texts)) if entry.get("target") else want
    tok, special = Tokenizer.from_str(json.dumps(entry.get("target") or data)), set(entry["special"])
    back = [tok.decode([i for i in ids if i not in special], skip_special_tokens=False).strip() for ids in out]
    differ = [label for label, a, b in zip(labels, tokenizer.decode(out), back) if a != b]
    return f"the site's tokenizer gives another text back than the directory's ({differ[0]})" if differ else None
