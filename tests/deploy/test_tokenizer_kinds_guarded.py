"""Every tokenizer kind tk reads, through translation's default path with the loop guard cutting.

A translation the loop guard stops is cut back to a whole word (toolkit.core.decoding.word_end), which asks the
model's tokenizer whether each token begins a word. Each kind a model directory can declare
(toolkit.core.declaration.TOKENIZERS) has a case here, built as its import writes it (a Hugging Face directory read by
tk's own import code, its tokenizer files and declaration written as `tk export hf:DIR` writes them), and is
translated with the default options by a scripted model that repeats one word of two to four pieces, out of step with
the words, so the guard's cut lands inside a word and the translation must end on the whole word. An architecture's
own test module (tests/pytorch/test_hf_*.py) adds the cases of its tokenizer kinds in a TOKENIZER_CASES of its own.
"""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import built_once
from helpers import Scripted

from toolkit.core import manifest as manifest_mod
from toolkit.core.declaration import TOKENIZERS, Declaration, DecodingRules, TokenizerDeclaration
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.digests import file_sha256
from toolkit.core.tokenizer import TextTokenizer
from toolkit.core.tokenizers import open_tokenizer
from toolkit.deploy.translate import TranslationModel, translate_batch

SOURCE = "The cat sleeps on the mat and the dog runs in the garden with the children."
# Made-up words: none is one piece of a vocabulary of a few hundred pieces trained on fra-eng lines, and one of them is
# two to four pieces for every such vocabulary.
WORDS = ("tatata", "momomo", "papapa", "lalala", "lala", "mama", "papa", "momo")


def _write(folder: Path, declaration: Declaration, files: list[str], kind: str) -> None:
    """What the model directory's manifest says of its tokenizer: its declaration and first file."""
    (folder / "sections.json").write_text(json.dumps({
        "declaration": declaration.to_dict(),
        "tokenizer": {"file": files[0], "sha256": file_sha256(folder / files[0]), "type": kind}}))


def _tk_sentencepiece(folder: Path, pairs: list[tuple[str, str]], source_end: bool = False) -> None:
    """tk's own: one SentencePiece model shared by both languages (source_end: an adapter's model trained on `text </s>`)."""
    from toolkit.core.tokenizer import Tokenizer

    Tokenizer.train([e for e, _ in pairs] + [f for _, f in pairs], 400).save(folder / "tokenizer.model")
    _write(folder, Declaration(tokenizer=TokenizerDeclaration(source_end=source_end)), ["tokenizer.model"], "sentencepiece")


def _words(folder: Path, pairs: list[tuple[str, str]]) -> None:
    """An adapter's word list (toolkit.core.word_vocab), with the made-up words in it."""
    from toolkit.core.word_vocab import SPECIALS, WordVocab

    found = {w for e, f in pairs for w in WordVocab(SPECIALS).words(f"{e} {f}")}
    vocab = WordVocab([*SPECIALS, *sorted(found | set(WORDS))])
    (folder / "vocab.json").write_text(vocab.to_json(), encoding="utf-8")
    rules = DecodingRules(start=vocab.special("bos"), end=vocab.special("eos"), pad=vocab.special("pad"))
    _write(folder, Declaration(rules, TokenizerDeclaration("words", "vocab.json", unk=vocab.special("unk")), origin="adapter"),
           ["vocab.json"], "words")


def _hf(make: Callable[[Path, list[tuple[str, str]]], object]) -> Callable[[Path, list[tuple[str, str]]], None]:
    """A Hugging Face directory (random weights: the scripted model stands in for them) read by tk's import code, its
    tokenizer files and declaration written into the model directory as `tk export hf:DIR` writes them."""

    def build(folder: Path, pairs: list[tuple[str, str]]) -> None:
        from toolkit.pytorch import bart_family, hf_import

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make(folder / "hf", pairs)
        sections = bart_family.write_files(hf_import.read(folder / "hf"), folder)
        (folder / "sections.json").write_text(json.dumps({k: sections[k] for k in ("declaration", "tokenizer")}))

    return build


def _marian(path: Path, pairs) -> None:
    from hf_marian_fixture import marian_directory

    marian_directory(path, pairs, steps=0)


def _m2m100(path: Path, pairs) -> None:
    from hf_seq2seq_fixture import m2m100_directory

    m2m100_directory(path, pairs, steps=0)


def _nllb(path: Path, pairs) -> None:
    from hf_seq2seq_fixture import nllb_directory

    nllb_directory(path, pairs, steps=0)


def _mbart_cc25(path: Path, pairs) -> None:
    from pytorch.test_hf_mbart import mbart_directory

    mbart_directory(path, pairs, "cc25", steps=0)


def _t5(mt5: bool) -> Callable[[Path, list[tuple[str, str]]], None]:
    def make(path: Path, pairs) -> None:
        from pytorch.test_hf_t5 import t5_directory

        t5_directory(path, pairs, mt5=mt5, steps=0)

    return make


# case -> (the tokenizer kind its manifest declares, how its model directory is built)
CASES: dict[str, tuple[str, Callable[[Path, list[tuple[str, str]]], None]]] = {
    "tk": ("sentencepiece", _tk_sentencepiece),
    "sentencepiece-source-end": ("sentencepiece", lambda folder, pairs: _tk_sentencepiece(folder, pairs, source_end=True)),
    "words": ("words", _words),
    "marian": ("marian", _hf(_marian)),
    "m2m100": ("m2m100", _hf(_m2m100)),
    "nllb-tokenizer.json": ("tokenizer.json", _hf(_nllb)),
    "mbart-cc25-sentencepiece.bpe.model": ("mbart", _hf(_mbart_cc25)),
    "t5-spiece": ("t5", _hf(_t5(mt5=False))),
    "t5-tokenizer.json": ("t5", _hf(_t5(mt5=True))),
}
for _module in sorted(Path(__file__).parents[1].glob("pytorch/test_hf_*.py")):  # an architecture's own cases
    if "TOKENIZER_CASES" in _module.read_text(encoding="utf-8"):
        for _case, (_kind, _make) in importlib.import_module(f"pytorch.{_module.stem}").TOKENIZER_CASES.items():
            CASES[_case] = (_kind, _hf(_make))


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    from hf_marian_fixture import fra_eng_lines

    return fra_eng_lines(corpus_zip, 300)


@pytest.fixture(scope="module")
def model_of(tmp_path_factory, pairs) -> Callable[[str], manifest_mod.Manifest]:
    """The manifest of a case's model directory (built once per run): its declaration and tokenizer files."""

    def get(case: str) -> manifest_mod.Manifest:
        folder = built_once(tmp_path_factory, f"tokenizer-kind-{case}", lambda f: CASES[case][1](f, pairs))
        sections = json.loads((folder / "sections.json").read_text())
        return manifest_mod.Manifest(directory=folder, model="tiny", kind="seq2seq", config={"max_len": 64}, graphs={},
                                     version=manifest_mod.VERSION, tokenizer=manifest_mod.TokenizerRecord(**sections["tokenizer"]),
                                     declaration=sections["declaration"])

    return get


def test_every_tokenizer_kind_has_a_case():
    """A tokenizer kind added to tk without a case here would go untranslated by these tests: add its case to CASES."""
    assert {kind for kind, _ in CASES.values()} == set(TOKENIZERS)


def _word_ids(m: manifest_mod.Manifest, tokenizer, word: str) -> list[int]:
    """The ids of `word` as the tokenizer encodes it after another word (a byte-level BPE marks a word's leading space,
    which a word alone lacks), without the ids it adds before the text (a start token) or after it (language codes,
    end tokens)."""
    rules = m.rules()
    added = {rules.start, rules.end, rules.pad, *(m.declared().tokenizer.languages or {}).values()}
    before, ids = tokenizer.encode(["a", f"a {word}"])
    same = next((k for k, (x, y) in enumerate(zip(before, ids)) if x != y), len(before))
    return [i for i in ids[same:] if i not in added]


def _looping_word(m: manifest_mod.Manifest, tokenizer, kind: str) -> list[int]:
    """A word of 2 to 4 pieces (the loop guard finds groups of up to 4); one id for a word-level vocabulary."""
    found = [ids for ids in (_word_ids(m, tokenizer, w) for w in WORDS) if 2 <= len(ids) <= 4 or kind == "words"]
    assert found, f"none of {WORDS} is 2 to 4 pieces for this {kind} tokenizer"
    return found[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_translation_the_loop_guard_cuts_ends_on_a_whole_word(case, model_of):
    m = model_of(case)
    kind = CASES[case][0]
    assert m.declared().tokenizer.kind == kind
    tokenizer = open_tokenizer(m)
    assert isinstance(tokenizer, TextTokenizer)  # the one interface translation asks a tokenizer through
    word = _looping_word(m, tokenizer, kind)
    rules = m.rules()
    # The model writes the forced first token (a language code) where there is one, then the word's later pieces and the
    # word again and again: the guard cuts after one copy of the repeated group, which begins inside the word.
    script = ([rules.forced_first] if rules.forced_first is not None else []) + word[1:] + word * 12
    vocab = 1 + max([*script, rules.start, rules.end, rules.pad, tokenizer.vocab_size])
    t = TranslationModel(m, tokenizer, lambda: Scripted(script, vocab), "cpu", 0.0)

    [[best]] = translate_batch(t, [SOURCE], DecodeOptions.for_manifest(m))  # tk translate's defaults: the loop guard on

    whole = tokenizer.decode([word])[0]
    assert best.stopped == "loop", best
    assert best.text.split()[-1] == whole, (best.text, whole)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_exported_mbart_cc25_translates_what_the_loop_guard_cuts(cli, pairs, tmp_path):
    """`tk export hf:DIR` of an mBART-cc25 whose tokenizer is its sentencepiece.bpe.model alone, then `tk translate`
    with its defaults: the model's output bias makes it write one word again and again, the guard cuts it, and the
    translation is that word, not an internal error."""
    import sentencepiece as spm
    from safetensors.torch import load_file, save_file

    hf, out = tmp_path / "hf", tmp_path / "tk"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _mbart_cc25(hf, pairs)
    sp = spm.SentencePieceProcessor(model_file=str(hf / "sentencepiece.bpe.model"))
    piece = next(p for p in map(sp.id_to_piece, range(sp.get_piece_size())) if p[:1] == "\u2581" and p[1:].isalpha() and len(p) > 2)
    weights = load_file(str(hf / "model.safetensors"))
    weights["final_logits_bias"][0, sp.piece_to_id(piece) + 1] = 100.0  # fairseq's id: the piece's plus one
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
    assert cli("export", f"hf:{hf}", "--out", out).exit_code == 0

    result = cli("translate", "--model", out, SOURCE)

    assert result.exit_code == 0, result.output
    assert "loop guard" in result.output
    assert piece[1:] in result.output.splitlines()
