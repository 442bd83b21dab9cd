"""The lexical shortlist (toolkit.core.shortlist): stored by `tk export DIR --shortlist FILE`, decoded over by
Translator(shortlist=True), each sentence over its own candidates, the same alone as in any batch."""

from __future__ import annotations

import shutil
import threading
import warnings

import numpy as np
import pytest
from conftest import REPO

from toolkit.convert.shortlist import store
from toolkit.core import shortlist
from toolkit.deploy.api import Translator

SENTENCES = ["I gave up.", "Tom is very tall.", "Where is the station?", "She likes green apples.",
             "We will go to Paris tomorrow.", "The dog is sleeping.", "Can you help me?", "I don't know."]
TRAINING = ["I gave up.", "Tom is tall.", "Where is the bank?", "She likes apples.", "We will go home.",
            "The cat is sleeping.", "Can you see me?", "I know.", "It is green.", "Paris is big.", "He is very kind.",
            "The station is near.", "I like dogs.", "They went to Paris.", "Help!", "Tomorrow is Sunday."]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The shipped model with a tight shortlist (3 candidates per source token, 5 frequent): rows of one batch then
    have very different candidate sets, so a row that saw the batch's union would translate differently."""
    directory = tmp_path_factory.mktemp("shortlist") / "transformer"
    shutil.copytree(REPO / "exported" / "transformer", directory)
    text = directory.parent / "training.txt"
    text.write_text("\n".join(TRAINING) + "\n", encoding="utf-8")
    store(directory, text, lambda m: None, per_token=3, frequent=5)
    return directory


@pytest.fixture(scope="module")
def shortlisted(model):
    return Translator(model, provider="cpu", variant="fp32", shortlist=True)


@pytest.fixture(scope="module")
def shortlisted_per_sentence(model):
    """The optimized variant is built in memory, so its decoder also reads each sentence's encoder outputs once
    (toolkit.graphs.sentence_cross): rows leaving the batch then take those per sentence, the shortlist's weights as
    they are."""
    translator = Translator(model, provider="cpu", variant="optimized", shortlist=True)
    assert translator._backend._per_sentence
    return translator


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("graph", ["stored", "per_sentence"])
def test_a_sentence_gets_the_same_tokens_alone_and_in_any_batch(request, graph, beam):
    shortlisted = request.getfixturevalue("shortlisted" if graph == "stored" else "shortlisted_per_sentence")
    alone = [shortlisted.translate_batch([s], beam=beam, streams=1)[0][0].text for s in SENTENCES]
    together = [n[0].text for n in shortlisted.translate_batch(SENTENCES, beam=beam, batch_size=64, streams=1)]
    reversed_ = [n[0].text for n in shortlisted.translate_batch(SENTENCES[::-1], beam=beam, batch_size=64, streams=1)][::-1]
    pairs = [n[0].text for n in shortlisted.translate_batch(SENTENCES, beam=beam, batch_size=2, streams=1)]
    assert together == alone
    assert reversed_ == alone
    assert pairs == alone


def test_the_batch_is_not_what_each_row_may_emit(model, shortlisted):
    """What makes the test above able to fail: the candidates of a sentence alone are fewer than its batch's union,
    and the shortlist changes what the model writes."""
    table = shortlist.load(model / shortlist.FILE)
    ids = shortlisted.loaded.tokenizer.encode(SENTENCES)
    width = max(map(len, ids))
    src = np.array([s + [0] * (width - len(s)) for s in ids])
    union, allowed = table.candidates(src, np.array(list(map(len, ids))))
    assert (allowed.sum(1) < len(union)).all()
    alone, _ = table.candidates(src[:1], np.array([len(ids[0])]))
    assert np.array_equal(union[allowed[0]], alone)
    plain = Translator(model, provider="cpu", variant="fp32").translate(SENTENCES)
    assert plain != shortlisted.translate(SENTENCES)


def test_a_directory_without_a_shortlist_is_one_line():
    from toolkit.core.errors import UsageError

    with pytest.raises(UsageError, match="stores no shortlist; make one with `tk export .* --shortlist FILE`"):
        Translator(REPO / "exported" / "transformer", provider="cpu", variant="fp32", shortlist=True)


def test_verify_refuses_a_bad_shortlist_naming_the_sentences_it_changes(model, corpus_zip, cli):
    result = cli("verify", model, "--shortlist", "--sentences", 40, "--data", corpus_zip)
    assert result.exit_code == 1, result.output
    assert "shortlist refused: " in result.output and "under the 99.5% required" in result.output
    assert "  sentence " in result.output  # each changed translation: its number, source, without -> with


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_verify_accepts_a_shortlist_that_changes_nothing(tmp_path, corpus_zip, variant):
    """Every token always allowed: the shortlisted output layer computes what the variant's whole one does (int8's from
    its own int8 weights and scales), so every translation is identical and the guard passes (the guard refuses by what
    changed, not by the shortlist's existence)."""
    from toolkit.core import manifest
    from toolkit.core.digests import file_sha256
    from toolkit.verify import shortlist as guard

    directory = tmp_path / "transformer"
    shutil.copytree(REPO / "exported" / "transformer", directory)
    vocab = manifest.load(directory).config["vocab_size"]
    table = shortlist.Shortlist(np.zeros(2, np.int64), np.zeros(0, np.int32), np.arange(vocab, dtype=np.int32))
    (directory / shortlist.FILE).write_bytes(table.to_bytes())
    with manifest.updating(directory) as m:
        m.shortlist = manifest.ShortlistRecord(shortlist.FILE, file_sha256(directory / shortlist.FILE), "every token", 0, vocab)
    verdict = guard.check(directory, variant, sentences=40, data=corpus_zip)
    assert verdict.identical == verdict.sentences == 40 and verdict.problems == []
    assert verdict.shortlisted == verdict.plain
    assert verdict.candidates == verdict.vocab == vocab  # every sentence decodes over the whole output layer
    assert guard.record(directory, verdict) == variant
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an accepted shortlist loads without a word
        Translator(directory, provider="cpu", variant=variant, shortlist=True)


def test_serve_shortlist_answers_what_each_sentence_gets_alone(model, shortlisted):
    """tk serve --shortlist: the requests' sentences batched together, each translated as it is alone."""
    pytest.importorskip("httpx", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from toolkit.cli.commands.serve import served_models
    from toolkit.serve.app import ServeConfig, create_app

    specs, _ = served_models((str(model),), "cpu", "fp32", None, "onnxruntime", {"source_lang": None, "target_lang": None},
                             shortlist=True)
    assert "shortlist" in specs[0].description
    alone = [shortlisted.translate([s])[0] for s in SENTENCES]
    with TestClient(create_app(specs, ServeConfig(allowed_hosts=("testserver",)))) as client:
        for _ in range(3000):
            if client.get("/ready").status_code == 200:
                break
            threading.Event().wait(0.01)
        answer = client.post("/v1/translate", json={"text": SENTENCES})
    assert answer.status_code == 200, answer.text
    assert answer.json()["translations"] == alone


def test_tk_translate_shortlist_writes_what_the_api_gives(model, shortlisted, cli):
    result = cli("translate", "--model", model, "--variant", "fp32", "--shortlist", "-q", *SENTENCES[:4])
    assert result.exit_code == 0, result.output
    warning, *lines = result.output.splitlines()  # the shortlist was never checked: one warning line first (below)
    assert warning.startswith("warning: the shortlist of ") and lines == shortlisted.translate(SENTENCES[:4])


def test_a_shortlist_tk_verify_refused_or_never_checked_is_said_on_every_load(model, corpus_zip, cli, tmp_path):
    """A shortlist is used as given, as an int8 variant is, but never in silence where its guard said no or never ran:
    tk translate and tk serve print one warning line, Translator warns (ShortlistWarning); `tk verify --shortlist
    --record` stores the verdict they read."""
    from toolkit.deploy.api import ShortlistWarning

    directory = tmp_path / "transformer"
    shutil.copytree(model, directory)
    with pytest.warns(ShortlistWarning, match="has not been checked on fp32: .* run tk verify .* --shortlist --record"):
        Translator(directory, provider="cpu", variant="optimized", shortlist=True)  # the optimized graphs: fp32's verdict
    result = cli("verify", directory, "--shortlist", "--record", "--sentences", 40, "--data", corpus_zip)
    assert result.exit_code == 1 and "recorded the shortlist's verdict on fp32" in result.output, result.output
    result = cli("translate", "--model", directory, "--shortlist", "-q", SENTENCES[0])
    assert result.exit_code == 0 and result.output.splitlines()[0].startswith(
        f"warning: the shortlist of {directory} was refused by tk verify --shortlist on fp32 ("), result.output
    with pytest.warns(ShortlistWarning, match="has not been checked on int8"):  # a verdict holds for its own variant
        Translator(directory, provider="cpu", variant="int8", shortlist=True)


def test_export_shortlist_is_for_an_exported_directory_alone(cli, tmp_path):
    text = tmp_path / "pairs.tsv"
    text.write_text("Hello.\tBonjour.\n", encoding="utf-8")
    result = cli("export", tmp_path, "--shortlist", text)
    assert result.exit_code != 0 and "tk export DIR --shortlist FILE" in result.output
    result = cli("export", REPO / "exported" / "transformer", "--shortlist", text, "--quantize", "int8")
    assert result.exit_code != 0 and "alone" in result.output


def test_a_runtime_that_cannot_decode_over_a_shortlist_says_so(model):
    from toolkit.core.errors import UsageError

    pytest.importorskip("ctranslate2")
    with pytest.raises(UsageError, match="runtime 'ctranslate2' cannot decode over a shortlist; use --runtime onnxruntime"):
        Translator(model, runtime="ctranslate2", shortlist=True)


def test_candidates_go_to_the_source_token_that_explains_them():
    """'big' (1) occurs once, beside 'x' (3), and becomes 'grand X' (11 13); 'x' is 'X' elsewhere and 'large' (2) is
    'grand' too. Co-occurrence ranks the rarer 'X' first for 'big' (Dice 0.5 against 0.33); the translation
    probabilities give 'X' to 'x' and keep 'grand' for 'big', as an aligner's lexical table does."""
    src = [[1, 3], [4, 3], [4, 3], [2, 5], [2, 6], [2, 7], [2, 5]]
    tgt = [[11, 13], [14, 13], [14, 13], [11, 15], [11, 16], [11, 17], [11, 15]]
    table = shortlist.estimate(src, tgt, per_token=1, frequent=0)
    best = {s: table.targets[table.offsets[s]:table.offsets[s + 1]].tolist() for s in (1, 2, 3, 4)}
    assert best == {1: [11], 2: [11], 3: [13], 4: [14]}


def test_the_int8_output_layer_is_fed_as_its_product_reads_it(model):
    """The int8 variant keeps the output layer's rows (the tied embedding looks tokens up in them) and transposes them
    for its product. Fed as an input, that Transpose would run at every step over the batch's gathered columns (12 ms
    of a 40 ms step at the opus-mt shape), so the rewrite feeds the gathered rows already transposed: no node of the
    shortlisted graph transposes a fed weight, and the fed array is the transposed rows the graph's own Transpose made."""
    import onnx

    from toolkit.core import manifest
    from toolkit.graphs import shortlist as graph_mod
    from toolkit.graphs.variants import graph_source

    m = manifest.load(model)
    vocab = m.config["vocab_size"]
    source, _ = graph_source(m, "decoder", "int8")
    graph, inputs, _ = graph_mod.shortlisted(source, vocab)
    rewritten = onnx.load_model_from_string(graph).graph
    fed = {g.name for g in inputs}
    assert not [n for n in rewritten.node if n.op_type == "Transpose" and set(n.input) & fed]
    transposed = [g for g in inputs if g.perm is not None]
    assert transposed, "the int8 output layer's rows are fed transposed"
    ids = np.array([0, 5, 7], dtype=np.int64)
    for g in transposed:
        taken = g.take(ids)
        assert taken.flags["C_CONTIGUOUS"] and taken.shape[1] == len(ids)
        np.testing.assert_array_equal(taken, g.weight[ids].T)


def test_beams_keep_one_copy_of_each_sentences_encoder_outputs(shortlisted_per_sentence):
    """At the first beam step each sentence's row becomes four: the mask takes four rows, the encoder's outputs stay
    one row per sentence (what sentence_cross saves at beam 4), the gathered weights stay as they are."""
    from toolkit.graphs.shortlist import MASK
    from toolkit.runtimes.onnxruntime.shortlisted import IDS

    backend = shortlisted_per_sentence._backend
    ids = shortlisted_per_sentence.loaded.tokenizer.encode(SENTENCES[:2])
    width = max(map(len, ids))
    state = backend.encode(np.array([s + [0] * (width - len(s)) for s in ids]), np.array(list(map(len, ids))))
    beams = backend.select(state, np.repeat(np.arange(2), 4))
    assert beams[MASK].shape[0] == 8
    assert all(beams[n].shape == state[n].shape for n in backend._per_sentence)
    assert all(beams[g.name] is state[g.name] for g in backend.shortlisting.weights) and beams[IDS] is state[IDS]


def test_a_decoder_with_a_weights_file_keeps_it_there(model, tmp_path):
    """The stored fp32 decoder's weights lie in weights.bin: the rewritten graph still refers to that file (its bytes
    stay small; a session is told the folder) and the weights gathered from are mapped from it, not copied. A graph
    naming a weights file outside its own directory is refused in one line, the file never read."""
    import onnx

    from toolkit.core import manifest
    from toolkit.core.errors import UsageError
    from toolkit.graphs import shortlist as graph_mod

    m = manifest.load(model)
    source = m.graph_path("decoder")
    graph, inputs, folder = graph_mod.shortlisted(source, m.config["vocab_size"])
    assert folder == source.parent
    assert len(graph) < (model / "weights.bin").stat().st_size / 4
    assert inputs and all(isinstance(g.weight, np.memmap) for g in inputs)
    whole = onnx.load(source)  # the same weight, read by onnx itself
    tables = {t.name: onnx.numpy_helper.to_array(t) for t in whole.graph.initializer}
    assert any(np.array_equal(np.asarray(g.weight), tables[n]) for g in inputs for n in tables if tables[n].shape == g.weight.shape)

    hostile = tmp_path / "inside"
    hostile.mkdir()
    (tmp_path / "outside.bin").write_bytes((model / "weights.bin").read_bytes())
    bad = onnx.load(source, load_external_data=False)
    for t in bad.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside.bin"
    onnx.save(bad, hostile / "decoder.onnx")
    with pytest.raises(UsageError, match="not a weights file of its own directory"):
        graph_mod.shortlisted(hostile / "decoder.onnx", m.config["vocab_size"])


def test_a_shortlisted_decoder_on_tk_s_kernels_takes_its_caches_rows_and_decodes_as_one_that_does_not(model, monkeypatch):
    """The shortlisted CPU decoder takes its caches' rows at a beam step as the plain one does
    (toolkit.graphs.native_attention's ROWS): every hypothesis and score of a beam, and greedy batches, are those of
    the same shortlisted decoder whose caches numpy reorders."""
    from toolkit.core.decoding import beam_search, greedy
    from toolkit.runtimes.onnxruntime import loading, native

    if native.library() is None:
        pytest.fail(native.status())
    ids = Translator(model, provider="cpu", variant="optimized").loaded.tokenizer.encode(SENTENCES)

    def searches(translator) -> list:
        backend = translator._backend
        return [[[(h.tokens, h.score) for h in nbest] for nbest in beam_search(backend, ids, 24, beam=4, n_best=4)],
                [(h.tokens, h.score) for h in greedy(backend, ids, 24)]]

    monkeypatch.setenv("TK_NO_CACHE", "1")
    with_rows = Translator(model, provider="cpu", variant="optimized", shortlist=True)
    assert with_rows._backend._graph_reorders
    real = loading.native_attention
    monkeypatch.setattr(loading, "native_attention", lambda graph, **options: real(graph))
    without = Translator(model, provider="cpu", variant="optimized", shortlist=True)
    assert not without._backend._graph_reorders
    assert searches(with_rows) == searches(without)
