"""A tokenizer.json of a model without language codes (a byte-level BPE, as GPT-2's and its descendants'): the source
gets the special tokens the file's own post-processor adds, the output loses them, and a piece that starts with the
byte-level mark of a leading space ("Ġ") begins a word, where the loop guard may cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration
from toolkit.core.tokenizers import JsonTokenizer

LINES = ["The cat sleeps on the mat.", "Le chat dort sur le tapis.", "The dog runs in the garden with the children."] * 20


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> JsonTokenizer:
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(LINES, vocab_size=300, show_progress=False, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    folder: Path = tmp_path_factory.mktemp("byte-level")
    bpe.save(str(folder / "tokenizer.json"))
    declared = TokenizerDeclaration(kind="tokenizer.json", source="tokenizer.json", unk=3)
    return JsonTokenizer.load(folder, declared, DecodingRules(start=2, end=2, pad=1))


def test_the_source_gets_the_post_processors_special_tokens_and_the_output_loses_them(byte_level):
    [ids] = byte_level.encode(["The cat sleeps in the garden."])
    assert ids[0] == 0 and ids[-1] == 2 and len(ids) > 4
    assert byte_level.encode([""]) == [[]]  # an empty line stays empty
    assert byte_level.decode([ids]) == ["The cat sleeps in the garden."]


def test_a_piece_with_the_byte_level_space_begins_a_word(byte_level):
    [ids] = byte_level.encode(["The children sleeps"])
    pieces = [byte_level.tok.id_to_token(i) for i in ids[1:-1]]
    assert any(p.startswith("\u0120") for p in pieces) and any(not p.startswith("\u0120") for p in pieces[1:])
    assert [byte_level.begins_word(i) for i in ids[1:-1]] == [p[0] == "\u0120" or not p[0].isalnum() for p in pieces]
