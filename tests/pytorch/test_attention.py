"""The attention pictures: the numbers behind them come from the exported graphs and are right.

Shapes, row sums, masks, parity with PyTorch, identical translations with and without the
attention outputs, and the drawn files themselves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from toolkit.core import manifest
from toolkit.core.decoding import greedy
from toolkit.deploy import attention_graphs
from toolkit.runtimes.onnxruntime.loading import load_sessions
from toolkit.runtimes.onnxruntime.sessions import create_session
from toolkit.verify.attention import probability_check

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SENTENCES = ["Go.", "I lost.", "Tom bought a new car last week.", "Where is the station?", "I'm home."]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def translated(tiny_export):
    return attention_graphs.translate(tiny_export, SENTENCES)


def test_export_declares_the_attention_outputs_with_named_axes(tiny_export):
    m = manifest.load(tiny_export)
    extra = attention_graphs.declared(m)
    heads, layers = m.config["num_heads"], m.config["num_layers"]
    assert [t.name for t in extra["encoder"]] == [f"encoder_attention_{i}" for i in range(layers)]
    assert extra["encoder"][0].dims == ("batch", heads, "src_len", "src_len")
    # Per decoder step, in the order the model computes them: self then cross, layer by layer.
    assert [t.name for t in extra["decoder"]][:2] == ["self_attention_0", "cross_attention_0"]
    assert extra["decoder"][0].dims == ("batch", heads, "past_len+1")
    assert extra["decoder"][1].dims == ("batch", heads, "src_len")


def test_attention_variant_gives_the_same_tokens_as_the_plain_graphs(tiny_export, translated):
    m = manifest.load(tiny_export)
    from toolkit.core.tokenizer import Tokenizer

    ids = [i[: m.max_len] for i in Tokenizer.load(m.tokenizer_path()).encode(SENTENCES)]
    plain = greedy(load_sessions(m).backend(), ids, m.max_len)
    assert [r.translation for r in translated] == Tokenizer.load(m.tokenizer_path()).decode([h.tokens for h in plain])
    for r, h in zip(translated, plain):
        assert r.target[: len(h.tokens)] == [Tokenizer.load(m.tokenizer_path()).sp.id_to_piece(t) for t in h.tokens]


def test_weights_have_one_row_per_output_piece_and_are_probabilities(tiny_export, translated):
    heads = manifest.load(tiny_export).config["num_heads"]
    for r in translated:
        s, t = len(r.source), len(r.target)
        assert r.weights["encoder_attention_0"].shape == (heads, s, s)
        assert r.weights["cross_attention_0"].shape == (heads, t, s)
        assert r.weights["self_attention_0"].shape == (heads, t, t)
        for name, w in r.weights.items():
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5, err_msg=name)
            assert (w >= 0).all()
        # Causal: step t attends to the decoder inputs up to its own, never later ones.
        self_w = r.weights["self_attention_1"]
        assert np.all(np.triu(self_w, k=1) == 0)
        assert r.target_inputs[0] == "<s>" and r.target_inputs[1:] == r.target[:-1]


def test_a_sentence_gets_the_same_weights_alone_as_in_a_batch(tiny_export, translated):
    """Sentences finish at different steps and leave the batch; each keeps its own weights."""
    for i in (0, 2):
        alone = attention_graphs.translate(tiny_export, [SENTENCES[i]])[0]
        assert alone.target == translated[i].target
        for name, w in alone.weights.items():
            np.testing.assert_allclose(translated[i].weights[name], w, atol=1e-5, err_msg=name)


def test_verify_checks_the_attention_outputs_against_pytorch(tiny_export):
    from toolkit.verify.run import verify

    report = verify(tiny_export, variants=["attention"], sentences=4, echo=lambda m: None)
    assert not report.failures, report.failures[:3]
    checked = {(r.check, r.output) for r in report.rows if r.variant == "attention"}
    for check in ("sweep", "decode"):
        assert (check, "cross_attention_1") in checked and (check, "self_attention_0") in checked
        assert (f"{check} sums", "cross_attention_1") in checked
    assert ("decode", "encoder_attention_0") in checked
    translation = [r for r in report.rows if r.check == "translation" and r.variant == "attention"]
    assert translation and translation[0].detail.startswith("4/4 identical")


def test_verify_fails_when_the_graph_weights_differ_from_pytorch(tiny_export, monkeypatch):
    """The weights of another layer (same shape, different values) must not pass as these."""
    from toolkit.pytorch import registry
    from toolkit.verify.run import verify

    entry = registry.get("transformer")
    honest = entry.read_attention
    monkeypatch.setattr(entry, "read_attention", lambda model, graph, batch: honest(model, graph, batch)[::-1])
    report = verify(tiny_export, variants=["attention"], sentences=2, echo=lambda m: None)
    bad = {r.output for r in report.failures}
    assert {"encoder_attention_0", "self_attention_0", "cross_attention_0"} <= bad
    assert not bad & {"memory", "log_probs"}  # the model's own outputs still agree: the failure names the weights


def test_probability_check_flags_rows_that_do_not_sum_to_one_and_weight_on_masked_keys():
    from toolkit.core.graphs import GraphSpec, TensorSpec

    t = TensorSpec("cross_attention", "float32", ("batch", "src_len"))
    spec = GraphSpec("decoder", (), (t,))
    feeds = {"src_len": np.array([2, 3])}
    good = {"cross_attention": np.array([[0.25, 0.75, 0.0], [0.2, 0.3, 0.5]], np.float32)}
    rows: list = []
    probability_check(rows, "sweep", spec, (t,), "cpu", "case", feeds, good)
    assert rows[-1].ok
    leaky = {"cross_attention": np.array([[0.25, 0.75, 1e-9], [0.2, 0.3, 0.5]], np.float32)}
    probability_check(rows, "sweep", spec, (t,), "cpu", "case", feeds, leaky)
    assert not rows[-1].ok and "masked keys" in rows[-1].detail
    short = {"cross_attention": np.array([[0.25, 0.70, 0.0], [0.2, 0.3, 0.5]], np.float32)}
    probability_check(rows, "sweep", spec, (t,), "cpu", "case", feeds, short)
    assert not rows[-1].ok and "sums to 0.95" in rows[-1].detail


def test_the_exported_masked_softmax_reproduces_the_textbook_example(random_export):
    """d2l 11.3: masked_softmax(rand(2, 2, 4), [2, 3]) keeps 2 and 3 keys; with lengths [[1, 3], [2, 4]]
    per query. Equal scores make the expected weights exact: uniform over the valid keys."""
    m = manifest.load(random_export("masked_softmax"))
    session = create_session(m.graph_path("model"))
    scores = np.zeros((2, 2, 4), np.float32)
    (w,) = session.run(None, {"scores": scores, "valid_lens": np.array([[2, 2], [3, 3]])})
    np.testing.assert_allclose(w, [[[0.5, 0.5, 0, 0]] * 2, [[1 / 3, 1 / 3, 1 / 3, 0]] * 2], atol=1e-7)
    (w,) = session.run(None, {"scores": scores, "valid_lens": np.array([[1, 3], [2, 4]])})
    np.testing.assert_allclose(w, [[[1, 0, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0]], [[0.5, 0.5, 0, 0], [0.25] * 4]], atol=1e-7)
    rand = np.random.default_rng(0).random((2, 2, 4), dtype=np.float32)
    (w,) = session.run(None, {"scores": rand, "valid_lens": np.array([[2, 2], [3, 3]])})
    assert np.all(w[0, :, 2:] == 0) and np.all(w[1, :, 3:] == 0)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)


def test_nw_numbers_match_the_metrics_recorded_at_training():
    """The curves in the NW picture come from the shipped graph: its test MSE is training's."""
    nw = attention_graphs.nadaraya_watson(REPO / "exported" / "nw")
    metrics = manifest.load(REPO / "exported" / "nw").to_dict()["metrics"]
    assert nw["learned_weights"].shape == (50, 50) and nw["nonparametric_weights"].shape == (50, 50)
    np.testing.assert_allclose(nw["learned_weights"].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(nw["learned"], (nw["learned_weights"] * nw["y_train"]).sum(-1), atol=1e-5)
    assert float(nw["w"]) == pytest.approx(metrics["w"], rel=1e-6)
    assert float(np.mean((nw["learned"] - nw["truth"]) ** 2)) == pytest.approx(metrics["test_mse"], rel=1e-4)
    assert float(np.mean((nw["nonparametric"] - nw["truth"]) ** 2)) == pytest.approx(metrics["test_mse_nonparametric"], rel=1e-4)


def test_tk_attention_draws_the_transformer_and_writes_json(cli, tiny_export, tmp_path):
    result = cli("attention", tiny_export, "Tom bought a new car last week.", "-o", tmp_path / "t.png", "--json", tmp_path / "t.json")
    assert result.exit_code == 0, result.output
    for part in ("encoder", "decoder-self", "cross"):
        png = (tmp_path / f"t-{part}.png").read_bytes()
        assert png.startswith(PNG) and len(png) < 300 * 1024
    data = json.loads((tmp_path / "t.json").read_text())
    w = np.array(data["weights"]["cross_attention_0"])
    assert w.shape == (manifest.load(tiny_export).config["num_heads"], len(data["target"]), len(data["source"]))


def test_alignment_takes_the_last_layers_cross_attention_averaged_over_heads():
    first = np.array([[[1.0, 0.0], [1.0, 0.0]]] * 2)  # (heads, targets, sources): everything on "a"
    last = np.array([[[0.3, 0.7], [0.9, 0.1]], [[0.5, 0.5], [0.7, 0.3]]])
    att = attention_graphs.Attention("transformer", "", "", ["a", "b"], ["x", "y"], ["<s>", "x"],
                                     {"cross_attention_0": first, "cross_attention_1": last, "self_attention_1": first})
    assert attention_graphs.alignment(att) == [("x", "b", pytest.approx(0.6)), ("y", "a", pytest.approx(0.8))]


def test_tk_attention_draws_nw(cli, tmp_path):
    result = cli("attention", REPO / "exported" / "nw", "-o", tmp_path / "nw.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "nw.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize("args, message", [
    (["exported/nw", "Go."], "takes no sentence"),
    (["exported/transformer"], "give one English sentence"),
    (["exported/missing", "Go."], "does not exist"),
])
def test_tk_attention_refuses_bad_input_in_one_line(cli, args, message):
    result = cli("attention", *[REPO / args[0], *args[1:]])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_directory_without_the_declaration_is_told_how_to_add_it(cli, tiny_export, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(tiny_export, old)
    m = manifest.load(old)
    m.attention = None
    m.save()
    result = cli("attention", old, "Go.", "-o", tmp_path / "x.png")
    assert result.exit_code == 2 and f"tk export {old} --attention" in result.output
    graphs = {p.name: p.read_bytes() for p in old.glob("*.onnx")}
    assert cli("export", old, "--attention").exit_code == 0
    assert {p.name: p.read_bytes() for p in old.glob("*.onnx")} == graphs  # the fp32 graphs are left as they are
    assert cli("attention", old, "Go.", "-o", tmp_path / "x.png").exit_code == 0


def test_tk_attention_never_imports_torch(tiny_export, tmp_path, assert_torch_free):
    assert_torch_free("attention", tiny_export, "Go.", "-o", tmp_path / "a.png")


def test_training_records_history_json_and_tk_plot_draws_it(cli, tiny_checkpoint, tmp_path):
    from toolkit.pytorch import checkpoint

    run = tiny_checkpoint.parent
    recorded = json.loads((run / "history.json").read_text())
    ckpt = checkpoint.load(tiny_checkpoint)
    assert recorded["model"] == "transformer"
    assert recorded["epochs"] == ckpt["progress"]["history"]
    result = cli("plot", run, "-o", tmp_path / "loss.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "loss.png").read_bytes().startswith(PNG)


def test_tk_plot_without_a_history_says_what_to_give(cli, tmp_path):
    result = cli("plot", tmp_path)
    assert result.exit_code == 2 and "history.json" in result.output
