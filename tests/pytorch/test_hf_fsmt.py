"""Hugging Face FSMTForConditionalGeneration in (fairseq's WMT19 models): its tokenizer without transformers, then
`tk export hf:DIR`, translations equal to generate's, greedy and beam 4, verify, int8 and OpenVINO.

FSMTTokenizer's files are made here: byte-pair merges learnt on Moses-tokenised English and German (or French) text,
vocab-src.json holding every piece, vocab-tgt.json only the target side's at ids of its own, so that a tokenizer that
reads one for the other fails. The model is a tiny FSMT built from FSMTConfig (no download), trained en -> fr for a
few dozen steps so that outputs end at lengths of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import check_int8_and_openvino, one_line_error
from hf_marian_fixture import fra_eng_lines, train_briefly
from hf_seq2seq_fixture import exported_import

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

# Accents, quotes of every kind, dashes, apostrophes, numbers, URLs, whitespace runs, control and full-width characters.
SENTENCES = [
    "Hello, world!", "It's a nice day, isn't it?", "I don't know -- what's up?", "The well-known author wrote 3-4 books.",
    "Tom's 3.5 kg cat costs $12,000.50 (or €11.000,25).", "\"Quoted\" and 'single' and `back` quotes.",
    "“Curly quotes” and ‘single ones’ — with an em dash – and an en dash.", "Ellipsis… and more...", "Über schöne Äpfel.",
    "Der schnelle braune Fuchs springt über den faulen Hund.", "Ich weiß nicht — was ist los?", "Straße, Maß, Fuß.",
    "  Leading and trailing spaces  ", "Tabs\tand\tmultiple     spaces.", "Line\nbreak inside.", "Numbers: 1,000 and 1.000 and 1 000.",
    "Percent 50% and 50 % and ５０％.", "Full-width：colon，comma！question？", "C'est l'été, n'est-ce pas ?", "« Guillemets » français.",
    "Email me at a.b@example.com or visit https://example.org/path?x=1&y=2.", "A & B < C > D | E.", "[brackets] {braces} (parens)",
    "Zero\u200bwidth and soft\u00adhyphen.", "Control\x07char and \x1b escape.", "ALL CAPS SENTENCE!", "mixedCase and camelCase words",
    "The U.S.A. and Mr. Smith met Dr. Jones at 5 p.m.", "He said: \"No!\"", "Dashes---many---of them", "A-B-C-D", "1-2-3",
    "e.g. i.e. etc.", "Café naïve résumé coöperate.", "Ça va? Très bien!", "日本語のテキスト。", "Привет, мир!", "x", "?", "...",
    "Hash #tag and @mention.", "Price: 9.99$ / 8,99 €", "It’s a typographic apostrophe’s test.", "over-the-top, state-of-the-art",
    "1990s and '90s and the 90's.", "Semicolon; colon: done.", "Slash/separated and back\\slash.", "Under_score and plus+sign.",
    "Mixed — dash–types - here.", "Question?! Exclamation!?",
]


def _moses_lines(lines: list[str], lang: str) -> list[str]:
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm, tok = MosesPunctNormalizer(lang=lang, pre_replace_unicode_punct=True), MosesTokenizer(lang=lang)
    return [tok.tokenize(norm.normalize(s), aggressive_dash_splits=True, return_str=True, escape=True) for s in lines]


def fsmt_tokenizer_files(path: Path, langs: list[str], source: list[str], target: list[str], size: int = 300, shared: bool = False):
    """FSMTTokenizer's files for `langs`, written by its own save_pretrained; returns the tokenizer. The merges are
    learnt by the `tokenizers` library's BPE trainer ("</w>" word ends, fairseq's four special tokens first); `shared`:
    vocab-tgt.json is vocab-src.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import FSMTTokenizer

    path.mkdir(parents=True, exist_ok=True)
    text = _moses_lines(source, langs[0]) + _moses_lines(target, langs[1])
    bpe = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=size, end_of_word_suffix="</w>", show_progress=False,
                                                      special_tokens=["<s>", "<pad>", "</s>", "<unk>"]))
    learnt = json.loads(bpe.to_str())["model"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in learnt["merges"]]
    target_pieces = {p for line in _moses_lines(target, langs[1]) for p in bpe.encode(line).tokens}
    target_vocab = {p: i for i, p in enumerate(["<s>", "<pad>", "</s>", "<unk>", *sorted(target_pieces - {"<unk>"})])}
    files = {"vocab-src.json": learnt["vocab"], "vocab-tgt.json": learnt["vocab"] if shared else target_vocab}
    for name, vocab in files.items():
        (path / name).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (path / "merges.txt").write_text("".join(f"{m} {1000 - k}\n" for k, m in enumerate(merges)), encoding="utf-8")
    tokenizer = FSMTTokenizer(langs=langs, src_vocab_file=str(path / "vocab-src.json"), merges_file=str(path / "merges.txt"),
                              tgt_vocab_file=str(path / "vocab-tgt.json"))
    tokenizer.save_pretrained(path)
    return tokenizer


def _declared(langs: list[str]):
    from toolkit.core.declaration import TokenizerDeclaration

    return TokenizerDeclaration(kind="fsmt", source="merges.txt", vocab="vocab-src.json", target_vocab="vocab-tgt.json",
                                source_lang=langs[0], target_lang=langs[1])


@pytest.fixture(scope="module")
def en_de(tmp_path_factory, corpus_zip) -> Path:
    english = [e for e, _ in fra_eng_lines(corpus_zip, 300)]
    german = [s for s in SENTENCES if any(c in s for c in "äöüßÄÖÜ")] * 3 + ["Das ist gut.", "Wo ist der Bahnhof?"] * 5
    directory = tmp_path_factory.mktemp("fsmt-en-de")
    fsmt_tokenizer_files(directory, ["en", "de"], english, german)
    return directory


@pytest.mark.transformers_lines
def test_the_tokenizer_gives_fsmt_tokenizer_ids_and_text(en_de, corpus_zip):
    from transformers import FSMTTokenizer

    from toolkit.core.fsmt_tokenizer import FsmtTokenizer

    theirs, ours = FSMTTokenizer.from_pretrained(en_de), FsmtTokenizer.load(en_de, _declared(["en", "de"]))
    texts = SENTENCES + [e for e, _ in fra_eng_lines(corpus_zip, 2000)[1000:1100]]
    ids = [theirs(t)["input_ids"] for t in texts]
    assert ours.encode(texts) == ids
    assert sum(3 in i for i in ids) >= 3 and sum(len(i) > 2 for i in ids) > 0.9 * len(ids)  # unknown pieces, and words
    # Output ids: the German side's own (a tokenizer reading vocab-src.json for vocab-tgt.json gets other pieces)
    back = FSMTTokenizer(langs=["de", "en"], src_vocab_file=str(en_de / "vocab-tgt.json"), merges_file=str(en_de / "merges.txt"),
                         tgt_vocab_file=str(en_de / "vocab-src.json"))
    german = [back(t)["input_ids"] for t in SENTENCES]
    assert ours.decode(german) == theirs.batch_decode(german, skip_special_tokens=True)
    within = [[i for i in seq if i < len(theirs.decoder)] for seq in ids]  # ids of the source side, read as target ones
    assert ours.decode(within) == theirs.batch_decode(within, skip_special_tokens=True)
    # where a word ends, for the loop guard's cut: a piece with "</w>"
    ends = [p.endswith("</w>") for p in theirs.convert_ids_to_tokens(german[8])]  # "Über schöne Äpfel."
    assert [ours.ends_word(i) for i in german[8]] == ends and True in ends and False in ends


def test_a_bad_merges_or_vocabulary_file_is_one_line(en_de, tmp_path):
    from toolkit.core.declaration import TokenizerDeclaration
    from toolkit.core.errors import UsageError
    from toolkit.core.fsmt_tokenizer import FsmtTokenizer

    for name, content in (("merges.txt", b"\xff\xfe bad"), ("vocab-src.json", b"[1, 2]"), ("vocab-tgt.json", b'{"a": "x"}')):
        bad = tmp_path / name.split(".")[0]
        bad.mkdir()
        for f in ("merges.txt", "vocab-src.json", "vocab-tgt.json"):
            (bad / f).write_bytes(content if f == name else (en_de / f).read_bytes())
        with pytest.raises(UsageError, match=name.replace(".", r"\.")) as e:
            FsmtTokenizer.load(bad, _declared(["en", "de"]))
        assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="both vocabularies and its language pair"):
        FsmtTokenizer.load(en_de, TokenizerDeclaration(kind="fsmt", source="merges.txt", vocab="vocab-src.json"))
    with pytest.raises(UsageError, match="file name inside the model directory"):
        TokenizerDeclaration(kind="fsmt", source="../merges.txt", vocab="vocab-src.json", target_vocab="vocab-tgt.json")


# ---- the model -------------------------------------------------------------------------------------------------------

class _Pairs:
    """FSMTTokenizer's batches with the targets read through vocab-tgt.json (FSMTTokenizer reads every text through
    vocab-src.json) and fairseq's decoder inputs (</s>, then the target shifted right), for train_briefly."""

    pad_token_id = 1

    def __init__(self, tokenizer, back):
        self.tokenizer, self.back = tokenizer, back

    def __call__(self, sources, text_target, **kwargs):
        batch = dict(self.tokenizer(sources, **kwargs))
        labels = self.back(text_target, **kwargs)["input_ids"]
        start = torch.full_like(labels[:, :1], self.tokenizer.sep_token_id)
        return {**batch, "labels": labels, "decoder_input_ids": torch.cat([start, labels[:, :-1]], dim=1)}


def fsmt_directory(path: Path, pairs: list[tuple[str, str]], *, steps: int = 150, seed: int = 0, shared: bool = False) -> Path:
    """Writes a tiny FSMTForConditionalGeneration (en -> fr) and its FSMTTokenizer into `path`; returns `path`."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer

    english, french = [e for e, _ in pairs], [f for _, f in pairs]
    tokenizer = fsmt_tokenizer_files(path, ["en", "fr"], english, french, size=400, shared=shared)
    back = FSMTTokenizer(langs=["fr", "en"], src_vocab_file=str(path / "vocab-tgt.json"), merges_file=str(path / "merges.txt"),
                         tgt_vocab_file=str(path / "vocab-src.json"))
    torch.manual_seed(seed)
    config = FSMTConfig(langs=["en", "fr"], src_vocab_size=len(tokenizer.encoder), tgt_vocab_size=len(tokenizer.decoder), d_model=32,
                        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, init_std=0.1)
    model = FSMTForConditionalGeneration(config)
    train_briefly(model, _Pairs(tokenizer, back), english, french, steps, seed)
    model.generation_config.max_length = 24
    model.generation_config.num_beams = 4
    model.save_pretrained(path)
    return path


# The loop-guard test's case of FSMT's tokenizer (tests/deploy/test_tokenizer_kinds_guarded.py): pieces that mark word
# ends. One vocabulary: the scripted model writes the source's ids.
TOKENIZER_CASES = {"fsmt": ("fsmt", lambda path, pairs: fsmt_directory(path, pairs, steps=0, shared=True))}


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def fsmt(tmp_path_factory, pairs) -> tuple[Path, Path]:
    """(Hugging Face directory, tk model directory exported from it with `tk export hf:DIR`), built once per run."""
    return exported_import(tmp_path_factory, "hf-fsmt", lambda path: fsmt_directory(path, pairs[:400]))


def _held_out(pairs, n: int = 40) -> list[str]:
    return [e for e, _ in pairs[1000: 1000 + n]]


def _generate(hf: Path, english: list[str], beam: int) -> tuple[list[str], list[bool]]:
    """generate's text, and whether each output ended before the limit."""
    from transformers import FSMTForConditionalGeneration, FSMTTokenizer

    tokenizer = FSMTTokenizer.from_pretrained(hf)
    model = FSMTForConditionalGeneration.from_pretrained(hf).eval()
    batch = tokenizer(english, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False)
    ended = [bool((row[1:] == tokenizer.sep_token_id).any()) for row in out]
    return tokenizer.batch_decode(out, skip_special_tokens=True), ended


@pytest.mark.transformers_lines
def test_the_exported_tokenizer_is_fsmt_tokenizers(fsmt, pairs):
    from transformers import FSMTTokenizer

    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer

    hf, out = fsmt
    m = manifest.load(out)
    assert m.declared().tokenizer.kind == "fsmt" and m.declared().tokenizer.served() == {"source": ["en"], "target": ["fr"]}
    texts = [e for e, _ in pairs[:300]]
    assert open_tokenizer(m).encode(texts) == [FSMTTokenizer.from_pretrained(hf)(t)["input_ids"] for t in texts]


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_generates(fsmt, pairs, beam):
    from toolkit import Translator

    hf, out = fsmt
    english = _held_out(pairs)
    want, ended = _generate(hf, english, beam)
    got = Translator(out).translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None)
    assert sum(ended) >= 0.8 * len(english) and len(set(want)) > 5  # outputs end, at lengths of their own
    assert sum(a == b for a, b in zip(got, want)) >= len(english) - 1  # all, but a near-tie this CPU may break either way


@pytest.mark.transformers_lines
def test_verify_holds_the_graphs_to_generate(cli, fsmt, tmp_path):
    hf, out = fsmt
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 12, "--json", report)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def test_int8_and_openvino_run_an_imported_fsmt(cli, fsmt, pairs, tmp_path):
    hf, out = fsmt
    check_int8_and_openvino(cli, hf, out, _held_out(pairs, 6), tmp_path)


def test_a_missing_language_pair_or_lower_casing_is_one_line(cli, fsmt, tmp_path):
    import shutil

    hf, _ = fsmt
    for change, expected in (({"langs": ["en"]}, "langs must name the source and target languages"),
                             ({"do_lower_case": True}, "do_lower_case is set")):
        bad = tmp_path / str(len(list(tmp_path.iterdir())))
        shutil.copytree(hf, bad)
        config = json.loads((bad / "tokenizer_config.json").read_text())
        (bad / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        assert expected in one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "out"), 2)


def test_tk_translate_runs_an_imported_fsmt_without_torch(fsmt, assert_torch_free):
    """The deploy path: Moses and BPE by sacremoses and toolkit.core.fsmt_tokenizer, the graphs by ONNX Runtime."""
    _, out = fsmt
    assert_torch_free("translate", "--model", out, "Hello, it's me -- again!")
