"""Text around the model (issue 46): a --keep term never breaks another protected span, a URL keeps its balanced
brackets, the loop guard ends on a whole word, --max-len is refused above the model's maximum; and no input fails
the others: in tk translate -i, the Python API, tk evaluate and translate-corpus, a line tk fails on gets a fallback's
or an empty translation with a warning naming it, and every other line is translated as before.

The failures are monkeypatched onto one chosen input, so these tests keep guarding after any one bug is fixed;
the input that was a real IndexError is tested as well.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings
from pathlib import Path

import pytest
from helpers import Scripted, one_line_error

from toolkit.core import placeholders, textprep
from toolkit.core.batching import GUARDED, DecodeOptions
from toolkit.core.decoding import greedy
from toolkit.core.tokenizer import EOS

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
POISON = "The poisoned line 7 is here."  # the input a test makes tk fail on
LINES = ["Hello.", "I am at home.", POISON, "Where is the station?", "It is 7 o'clock."]
TWELVE = "(11)(22)(33)(44)(55)(66)(77)(88)(99)(100)(111)(122)"  # an IndexError before: 12 spans, no space between


@pytest.fixture(scope="module")
def shipped():
    from toolkit.deploy.translate import open_model

    return open_model(SHIPPED, "cpu")


def _translate(model, texts, **kwargs):
    from toolkit.deploy.translate import translate_batch

    return [n[0].text for n in translate_batch(model, texts, DecodeOptions.bare(max_len=64, **GUARDED), **kwargs)]


# ---- --keep terms and the other spans ------------------------------------------------------------------------------

@pytest.mark.parametrize("line, keep, spans", [
    ("Visit https://example.com/path?id=5 or mail bob@example.com today.", ("example",),
     ["https://example.com/path?id=5", "bob@example.com"]),
    ("Call 555 0199 now.", ("55",), ["555 0199"]),  # not a term inside a number
    ("Call 555 0199 now.", ("0199",), ["555 0199"]),  # a term that is part of a number keeps the number whole
    ("The example shows an example.", ("example",), ["example", "example"]),  # whole words still match
    ("Examples of example.", ("example",), ["example"]),  # not inside a longer word
    ("Room 101 of TK-9000 Pro.", ("TK-9000 Pro",), ["101", "TK-9000 Pro"]),
    ("我住在東京タワーの近く", ("タワー",), ["タワー"]),  # a script without spaces has no word boundaries to wait for
])
def test_a_keep_term_never_breaks_a_url_an_email_or_a_number(line, keep, spans):
    protected, got, _ = placeholders.protect_terms(line, keep)
    assert got == spans
    # Every span comes back whole: nothing of the line outside the placeholders was part of one.
    assert textprep.join([textprep.finish(s, s.text) for s in textprep.prepare(line, keep)]) == " ".join(line.split())


def test_keep_example_leaves_the_url_and_the_email_of_the_translation_whole(cli):
    result = cli("translate", "--model", SHIPPED, "-q", "--keep", "example",
                 "Visit https://example.com/path?id=5 or mail bob@example.com today.")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("https://example.com/path?id=5") == 1 and out.count("bob@example.com") == 1, out


# ---- URLs and brackets ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, url", [
    ("See https://en.wikipedia.org/wiki/Python_(programming_language) for details.",
     "https://en.wikipedia.org/wiki/Python_(programming_language)"),
    ("See https://en.wikipedia.org/wiki/Python_(programming_language).", "https://en.wikipedia.org/wiki/Python_(programming_language)"),
    ("(see https://tatoeba.org/fr)", "https://tatoeba.org/fr"),  # an unbalanced ) is the sentence's
    ("Go to www.example.com/a[1], then stop.", "www.example.com/a[1]"),
    ("Is it https://x.org/?q=1!", "https://x.org/?q=1"),
])
def test_a_url_keeps_its_balanced_brackets_and_leaves_the_sentence_its_punctuation(line, url):
    assert placeholders.protect_terms(line)[1] == [url]


def test_the_wikipedia_url_comes_out_whole(cli):
    url = "https://en.wikipedia.org/wiki/Python_(programming_language)"
    result = cli("translate", "--model", SHIPPED, "-q", f"See {url} for details.")
    assert result.exit_code == 0, result.output
    assert re.search(re.escape(url) + r"(\s|$)", result.stdout), result.stdout


# ---- the loop guard ends on a whole word ----------------------------------------------------------------------------

def test_word_end_keeps_the_shortest_output_that_ends_on_a_whole_word():
    from toolkit.core.decoding import word_end

    pieces = {1: "▁Les", 2: "▁t", 3: "aux", 4: "▁post", 5: ",", 6: "al"}
    begins = lambda a, b: pieces[b][0] in "▁,"  # noqa: E731
    # Cut inside "postaux": the next copy's ▁post shows where the word ends.
    assert word_end([1, 2, 3, 4], [3, 4, 3], begins) == [1, 2, 3, 4, 3]
    # A loop inside one word ("postalalal"): the unfinished word is dropped, not cut.
    assert word_end([1, 4, 6], [6, 6, 6], begins) == [1]
    assert word_end([4, 6], [6, 6], begins) == [4, 6]  # a single word: kept as it is, never emptied
    assert word_end([1, 5], [5, 5, 5], begins) == [1, 5]  # at a word's end already
    assert word_end([1, 2], [], begins) == [1, 2]  # nothing cut off: not a loop's cut


def test_word_end_cuts_where_pieces_mark_a_words_end():
    """End-of-word BPE (subword-nmt's, fairseq's) marks the last piece of a word ("aux</w>"), not the first: the
    boundary after a piece is said by that piece."""
    from toolkit.core.decoding import word_end
    from toolkit.core.tokenizer import TextTokenizer

    class EndMarked(TextTokenizer):
        pieces = {1: "les</w>", 2: "t", 3: "aux</w>", 4: "post", 5: ",</w>", 6: "al"}
        vocab_size, encode, decode = 7, None, None

        def piece(self, token: int) -> str:
            return self.pieces[token]

    tok = EndMarked()
    assert [tok.ends_word(i) for i in range(1, 7)] == [True, False, True, False, True, False]
    # "les t aux</w> post aux</w> post": cut after "post", the next copy's "aux</w>" ends the word
    assert word_end([1, 2, 3, 4], [3, 4, 3], tok.boundary) == [1, 2, 3, 4, 3]
    assert word_end([1, 4, 6], [6, 6, 6], tok.boundary) == [1]  # "postalalal" never ends: dropped, not cut
    assert word_end([1, 3], [3, 3], tok.boundary) == [1, 3]  # at a word's end already


def test_the_guarded_translation_is_made_of_whole_words_of_the_unguarded_one(shipped):
    """Lines that loop in one shipped model or another (the 3 + 3 model looped on the first): wherever the guard cuts,
    what is left is whole words of the unguarded output; at least one line must be cut for the test to look at a cut."""
    from toolkit.deploy.translate import translate_batch

    lines = ["International postal rates differ according to destination.", "I said no, no, no, no, no, no, no, no.",
             "la la la la la la la la la la la la la la"]
    cut = 0
    for line in lines:
        warned: list[str] = []
        guarded = _translate(shipped, [line], warn=warned.append)[0]
        if not any("loop guard" in w for w in warned):
            continue
        cut += 1
        bare = translate_batch(shipped, [line], DecodeOptions.bare(max_len=64, **{**GUARDED, "loop_guard": False}))[0][0].text
        assert guarded and set(guarded.split()) <= set(bare.split()), (guarded, bare)
    assert cut  # the guard cut at least one line: the property was looked at



@pytest.mark.parametrize("tokens", [[5, 9, 7, 8, 7, 8, 7, 8, 7, 8], [5, 6, 6, 6, 6, 6, 6], [5, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7]])
def test_ctranslate2s_guard_cuts_where_tks_loop_does_and_keeps_the_same_rest(tokens):
    # One function for every runtime's guard: CTranslate2's post-hoc cut hands word_end what tk's loop hands it.
    from toolkit.runtimes.ctranslate2.engine import Ct2Backend

    class Scores:
        def score_batch(self, src, tgt):
            return [type("R", (), {"log_probs": [-0.01] * len(tgt[0])})()]

    opts = DecodeOptions.bare(max_len=64, loop_guard=True)
    tk = greedy(Scripted(tokens, 20), [[4, 4], [4]], 64, loop_guard=True)  # batched and single-row loops alike
    tk_one = greedy(Scripted(tokens, 20), [[4]], 64, loop_guard=True)[0]
    ct2 = Ct2Backend(Scores(), EOS)._hypothesis([4], tokens, -1.0, 64, 64, opts)
    assert tk_one.stopped == ct2.stopped == "loop"
    for h in (tk[0], tk[1], tk_one):
        assert (h.tokens, h.rest) == (ct2.tokens, ct2.rest)


def test_the_length_warning_at_the_models_maximum_does_not_ask_to_raise_max_len(shipped):
    long_french = " ".join(["maison", "chat", "chien", "table", "livre", "arbre", "fleur", "pomme"] * 10)
    tokens = shipped.tokenizer.encode([long_french])[0]
    model = dataclasses.replace(shipped, backend=lambda: Scripted(tokens, shipped.tokenizer.vocab_size), threads=None)
    warned: list[str] = []
    _translate(model, [" ".join(["house"] * 40) + "."], warn=warned.append)
    [note] = [w for w in warned if "length" in w or "maximum" in w]
    assert f"maximum of {shipped.manifest.max_len} tokens" in note and "--max-len" not in note, note


@pytest.mark.parametrize("command", ["translate", "translate-corpus"])
def test_max_len_above_the_models_maximum_is_refused_in_one_line(cli, tmp_path, command):
    maximum = __import__("toolkit.core.manifest", fromlist=["load"]).load(SHIPPED).max_len
    args = (["--model", SHIPPED, "Hello."] if command == "translate"
            else [SHIPPED, tmp_path / "in.txt", tmp_path / "out"])
    (tmp_path / "in.txt").write_text("Hello.\n")
    result = cli(command, "--max-len", maximum + 36, *args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"maximum of {maximum} tokens" in errors[0] and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
    assert cli("translate", "--model", SHIPPED, "-q", "--max-len", maximum, "Hello.").exit_code == 0


# ---- the input that was an IndexError -------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [TWELVE, "1=2=3=4=5=6=7=8=9=10=11=12", "www.a.org" + "".join(f"/{i}@x.org" for i in range(12))])
def test_spans_with_no_space_between_them_are_one_placeholder(line):
    segments = textprep.prepare(line)
    assert all(len(s.spans) <= placeholders.PER_INPUT for s in segments)
    assert textprep.join([textprep.finish(s, s.text) for s in segments]) == line


def test_twelve_glued_spans_translate_with_every_number(cli):
    result = cli("translate", "--model", SHIPPED, "-q", TWELVE, "Hello.")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert all(first.count(f"{n}") >= 1 for n in (11, 22, 33, 44, 55, 66, 77, 88, 99, 100, 111, 122)), first


# ---- no input fails the others --------------------------------------------------------------------------------------

def _poison_prepare(monkeypatch, plain_too: bool) -> None:
    """textprep.prepare raises on POISON (with placeholders only, or also in the plain form)."""
    real = textprep.prepare

    def prepare(line, *args, **kwargs):
        if line == POISON and (plain_too or kwargs.get("protect", True)):
            raise IndexError("list index out of range")
        return real(line, *args, **kwargs)

    monkeypatch.setattr(textprep, "prepare", prepare)


def _poison_decoding(monkeypatch, model) -> None:
    """The decoding loop raises whenever POISON's sentence is in its batch (a failure only the model step sees)."""
    from toolkit.deploy import translate

    [sentence] = textprep.prepare(POISON)
    poison = model.tokenizer.encode([sentence.text])[0]
    real = translate.decode_ids

    def decode_ids(backend, src, opts, done=None, finish=None):
        if any(list(s) == poison for s in src):
            raise RuntimeError("the ONNX Runtime step failed")
        return real(backend, src, opts, done, finish)

    monkeypatch.setattr(translate, "decode_ids", decode_ids)


@pytest.fixture(scope="module")
def expected(shipped):
    return _translate(shipped, LINES)


@pytest.mark.parametrize("failure", ["prepare", "prepare and plain", "decoding"])
def test_a_line_tk_fails_on_fails_only_itself_in_translate_i(cli, shipped, expected, tmp_path, monkeypatch, failure):
    if failure == "decoding":
        _poison_decoding(monkeypatch, shipped)
    else:
        _poison_prepare(monkeypatch, plain_too=failure == "prepare and plain")
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = cli("translate", "--model", SHIPPED, "-i", src, "-o", out)
    assert result.exit_code == 0, result.output
    got = out.read_text(encoding="utf-8").splitlines()
    assert len(got) == len(LINES)
    assert [g for i, g in enumerate(got) if i != 2] == [e for i, e in enumerate(expected) if i != 2]
    if failure == "prepare":  # the plain form of the line, translated without placeholders
        assert got[2] and "⦅" not in got[2]
    else:
        assert got[2] == ""
    assert re.search(r"warning: line 3: \w+ in tk \(", result.output), result.output
    assert "1 line that tk failed on" in result.output and "Traceback" not in result.output


def test_a_text_tk_fails_on_fails_only_itself_in_the_api(shipped, expected, monkeypatch):
    from toolkit.deploy.api import TextFailedWarning, Translator

    translator = Translator.__new__(Translator)
    translator.loaded, translator._backend = shipped, shipped.backend()
    _poison_prepare(monkeypatch, plain_too=True)
    with pytest.warns(TextFailedWarning, match=r"texts\[2\]: IndexError"):
        got = translator.translate(LINES)
    assert got == [*expected[:2], "", *expected[3:]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TextFailedWarning)
        assert translator.translate([LINES[0]]) == expected[:1]
        assert all(translator.translate([TWELVE]))  # the former IndexError, for real


def test_a_sentence_tk_fails_on_fails_only_itself_in_evaluate(shipped, expected, monkeypatch):
    from toolkit.deploy.evaluate import translated

    _poison_decoding(monkeypatch, shipped)
    said: list[str] = []
    got = translated(shipped, LINES, DecodeOptions.bare(max_len=64, **GUARDED), echo=said.append, what="test_split greedy")
    assert got == [*expected[:2], "", *expected[3:]]
    assert len(said) == 1 and said[0].startswith("warning: test_split greedy sentence 3: RuntimeError in tk")


def test_when_every_line_fails_the_error_is_raised_not_hidden(shipped, monkeypatch):
    # A model or device that fails every batch is no one input's fault: nothing is papered over with empty lines.
    from toolkit.deploy import translate

    monkeypatch.setattr(translate, "decode_ids", lambda *a: (_ for _ in ()).throw(RuntimeError("broken")))
    with pytest.raises(RuntimeError, match="broken"):
        _translate(shipped, LINES[:3])


def _shard(tmp_path, lines):
    from toolkit.corpus import inputs

    shard = tmp_path / "shard.txt"
    shard.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    _, digest = inputs.read_text(str(shard), 0, len(lines))
    return shard, {"shard": 0, "path": str(shard), "kind": "text", "first_line": 1, "lines": len(lines), "offset": 0,
                   "input_sha256": digest, "column": ""}


def test_a_line_tk_fails_on_fails_only_itself_in_a_corpus_shard(shipped, expected, tmp_path, monkeypatch):
    from toolkit.corpus.worker import ShardTranslator

    translator = ShardTranslator(str(SHIPPED), "cpu", "fp32", 1, DecodeOptions.for_model(64, "cpu", streams=1),
                                 {"keep": (), "split": True, "enabled": True}, False)
    shard, row = _shard(tmp_path, [*LINES, TWELVE])
    _poison_prepare(monkeypatch, plain_too=True)
    status, text, notes = translator.translate_shard(row)
    assert status == "done"
    got = text.splitlines()
    assert got[:5] == [*expected[:2], "", *expected[3:]] and got[5]
    assert notes.splitlines() == [n for n in notes.splitlines() if n.startswith(f"{shard} line 3: IndexError in tk")] != []
    # A bug outside any one line fails its shard in one line: the run goes on, the other shards are kept.
    monkeypatch.setattr("toolkit.deploy.translate.translate_lines", lambda *a, **k: [][1])
    status, text, error = translator.translate_shard(row)
    assert (status, text) == ("failed", "") and error.startswith("IndexError in tk while translating lines 1-6")


def test_translate_corpus_refuses_a_model_that_fails_its_digest_before_ray_starts(cli, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(SHIPPED, model)
    with open(model / "tokenizer.model", "ab") as f:
        f.write(b"tampered")
    (tmp_path / "in.txt").write_text("Hello.\n")
    result = cli("translate-corpus", model, tmp_path / "in.txt", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ") and "sha256" in result.output, result.output
    assert "rerun" not in result.output and "Ray" not in result.output and not (tmp_path / "out").exists()


# ---- an install problem is no line's fault -------------------------------------------------------------------------

def test_a_missing_sentence_splitter_is_one_error_not_a_file_of_empty_lines(cli, tiny_export, tmp_path, monkeypatch):
    """Found on a machine without sentencex (a core dependency): tk translate wrote 50 empty lines, warned 50 times and
    exited 0. Now translate, the API and serve refuse in one line naming the package and the fix, and write nothing."""
    import sys

    from toolkit.core.errors import UsageError
    from toolkit.deploy.api import Translator

    monkeypatch.setitem(sys.modules, "sentencex", None)  # `import sentencex` raises ImportError
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    line = one_line_error(cli("translate", "--model", SHIPPED, "-i", src, "-o", out), 2)
    assert "sentencex is not installed" in line and "--no-split" in line and not out.exists()
    with pytest.raises(UsageError, match="sentencex is not installed"):
        Translator(SHIPPED).translate(LINES[:2])
    assert Translator(SHIPPED).translate(LINES[:2], split=False)  # the way round it that the message names
    line = one_line_error(cli("serve", tiny_export, "--port", 0), 2)
    assert "sentencex is not installed" in line

