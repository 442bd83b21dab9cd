"""Hugging Face MarianMTModel in: `tk export hf:DIR`, then verify, translate and localize, against transformers itself.

Two models built here (tests/hf_marian_fixture.py), no download: a shared vocabulary with swish and scaled embeddings
(2 + 2 layers), and separate vocabularies with gelu, unscaled embeddings and a 3-layer encoder over a 1-layer decoder.
The translations of 60 held-out sentences must be token-identical to MarianMTModel.generate's, greedy and beam 4.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import built_once
from helpers import one_line_error
from hf_marian_fixture import fra_eng_lines, marian_directory
from onnx import numpy_helper
from verify.test_localize import _edit_decoder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SHAPES = {
    "shared-swish": {},
    "separate-gelu": {"separate": True, "activation": "gelu", "d_model": 48, "layers": (3, 1), "heads": 6, "ffn": 96, "scale": False},
}


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def built(tmp_path_factory, pairs) -> dict[str, tuple[Path, Path]]:
    """Each shape's (Hugging Face directory, tk model directory exported from it with `tk export hf:DIR`), built once per
    run (shared-swish is also the Marian model tests/verify/test_planted_faults_hf.py plants faults in)."""
    from click.testing import CliRunner

    from toolkit.cli import main

    def build(shape: dict, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            marian_directory(root / "hf", pairs[:400], **shape)
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    out = {}
    for name, shape in SHAPES.items():
        root = built_once(tmp_path_factory, f"hf-marian-{name}", lambda folder, shape=shape: build(shape, folder))
        out[name] = (root / "hf", root / "tk")
    return out


@pytest.fixture(params=list(SHAPES))
def marian(request, built) -> tuple[Path, Path]:
    return built[request.param]


@pytest.fixture()
def shared(built) -> tuple[Path, Path]:
    return built["shared-swish"]


def _held_out(pairs, n: int = 60) -> list[str]:
    return [e for e, _ in pairs[1000: 1000 + n]]


def _generate(hf: Path, english: list[str], beam: int) -> tuple[list[list[int]], list[str]]:
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(hf)
    model = MarianMTModel.from_pretrained(hf).eval()
    batch = tokenizer(english, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False)
    end = model.config.eos_token_id
    # generate pads a row only after its end token: a row without one is all tokens
    tokens = [row[1: row.index(end, 1)] if end in row[1:] else row[1:] for row in out.tolist()]
    return tokens, tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.mark.transformers_lines
def test_the_tokenizer_gives_transformers_ids_and_text(marian, pairs):
    from transformers import MarianTokenizer

    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer

    hf, out = marian
    reference = MarianTokenizer.from_pretrained(hf)
    ours = open_tokenizer(manifest.load(out))
    english = [e for e, _ in pairs[:300]]
    assert ours.encode(english) == [reference(e)["input_ids"] for e in english]
    french = [f for _, f in pairs[:300]]
    target_ids = [reference(text_target=f)["input_ids"] for f in french]
    assert ours.decode(target_ids) == reference.batch_decode(target_ids, skip_special_tokens=True)


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_token_identical_to_generate(marian, pairs, beam):
    """What the issue's user runs: Translator(OUT).translate(..., raw=True, loop_guard=False, max_len_a=None) against
    generate, greedy and beam 4 (the generation config's rules: length penalty, early stopping, max_length)."""
    from toolkit import Translator
    from toolkit.core.batching import decode_ids
    from toolkit.core.decode_options import DecodeOptions

    hf, out = marian
    english = _held_out(pairs)
    want_tokens, want_text = _generate(hf, english, beam)
    translator = Translator(out)
    texts = translator.translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None)
    assert sum(a != b for a, b in zip(texts, want_text)) <= NEAR_TIES
    m = translator.manifest
    opts = DecodeOptions.for_manifest(m, beam=beam, loop_guard=False, max_len_a=None)
    src = translator.loaded.tokenizer.encode(english)
    got = [h[0].tokens for h in decode_ids(translator.loaded.backend(), src, opts)]
    _assert_identical_but_for_near_ties(hf, m, src, want_tokens, got, beam)
    # Both ways a hypothesis ends are exercised: its end token, and (the shared model) the length limit, where the
    # generation config forces the end token into the last place.
    lengths = {len(t) for t in want_tokens}
    assert min(lengths) < m.max_output_len
    if "shared-swish" in str(out) and transformers_major() >= 5:
        # The fixture's shared model, trained on transformers 5, runs some sentences to the limit; on 4.x the same
        # training draws other random numbers and need not, so only the line that trains it so is held to it.
        assert m.max_output_len in lengths


NEAR_TIES = 2  # of 60 sentences, at most this many may part at a near-tie (below), on whatever CPU runs the tests


def _assert_identical_but_for_near_ties(hf: Path, m, src, want: list[list[int]], got: list[list[int]], beam: int) -> None:
    """ONNX Runtime's tokens are generate's, except where two candidates were a near-tie that rounding on this CPU may
    break either way (AVX2 and AVX-512 round differently). tk's loop over the PyTorch model must match generate exactly:
    the decoding rules are the same everywhere; only the graphs' arithmetic may differ, by ~1e-6."""
    from toolkit.core.decoding import translate_ids
    from toolkit.pytorch import hf_marian
    from toolkit.pytorch.torch_backend import TorchBackend

    rules, specs = m.rules(), m.specs()
    reference = TorchBackend(hf_marian.read(f"hf:{hf}").model, specs["encoder"], specs["decoder"])
    exact = [h[0].tokens for h in translate_ids(reference, src, m.max_output_len, beam, None, 1, None, False, rules)]
    assert exact == want
    parted = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert len(parted) <= NEAR_TIES, parted
    for i in parted:
        if beam == 1:  # greedy parted at a step where PyTorch puts the two tokens within 1e-4 of each other
            from toolkit.verify.checks import prefix_log_probs

            k = next(k for k, (a, b) in enumerate(zip([*want[i], rules.end], [*got[i], rules.end])) if a != b)
            lp = prefix_log_probs(reference, src[i], want[i][:k], rules)
            pick = [t[k] if k < len(t) else rules.end for t in (want[i], got[i])]
            assert abs(float(lp[pick[0]] - lp[pick[1]])) < 1e-4, (i, k, pick)
        else:  # beam search ended on two hypotheses that PyTorch scores within 1e-4 of each other
            scores = [_normalized_score(reference, src[i], tokens, rules, m) for tokens in (want[i], got[i])]
            assert abs(scores[0] - scores[1]) < 1e-4, (i, scores)


def _normalized_score(backend, src: list[int], tokens: list[int], rules, m) -> float:
    """The PyTorch model's log-probability of `tokens` (and the end token, if they end before the limit), normalised
    by the model's beam rule: what beam search ranks finished hypotheses by."""
    import numpy as np

    from toolkit.core.decoding import pad_batch

    ids, lens = pad_batch([src], rules.pad)
    state, total = backend.encode(ids, lens), 0.0
    ended = len(tokens) < m.max_output_len
    for prev, token in zip([rules.start, *tokens], [*tokens, rules.end] if ended else tokens):
        lp, state = backend.step(np.array([prev], dtype=np.int64), state)
        total += float(lp[0, token])
    return rules.normalized(total, len(tokens), rules.alpha, ended)


@pytest.mark.transformers_lines
def test_verify_passes_and_holds_the_graphs_to_generate(cli, marian, tmp_path):
    hf, out = marian
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--json", report)
    assert result.exit_code == 0, result.output
    assert "reference: Hugging Face directory" in result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def _origin(out: Path, node: str) -> str:
    return json.loads((out / "decoder.nodes.json").read_text())[node][0]


def _activation_changed(graph) -> str:
    """The last decoder layer's activation: swish's Sigmoid (or gelu's Erf) turned into Tanh."""
    node = [n for n in graph.node if n.op_type in ("Sigmoid", "Erf")][-1]
    node.op_type = "Tanh"
    return node.name


def _scale_changed(graph) -> str:
    """The scaling constant of the last decoder layer's self-attention (q k^T * head_dim^-0.5), times 1.5."""
    nodes = [n for n in graph.node if n.op_type == "Mul" and any(i.name == n.input[1] for i in graph.initializer)]
    node = next(n for n in reversed(nodes) if any(x.op_type == "Softmax" and n.output[0] in x.input for x in graph.node))
    scale = next(i for i in graph.initializer if i.name == node.input[1])
    graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(1.5), name="planted_scale"))
    node.input[1] = "planted_scale"
    return node.name


@pytest.mark.parametrize("shape, change, module", [("shared-swish", _activation_changed, "activation_fn"),
                                                   ("separate-gelu", _activation_changed, "activation_fn"),
                                                   ("shared-swish", _scale_changed, "self_attn")])
def test_a_planted_fault_fails_verify_and_localize_names_the_transformers_module(cli, built, tmp_path, shape, change, module):
    hf, out = built[shape]
    directory, planted = _edit_decoder(out, tmp_path, change)
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 4, "--json", report)
    assert result.exit_code == 1, result.output
    layers = json.loads((out / "manifest.json").read_text())["config"]["decoder_layers"]
    first = json.loads(report.read_text())["localization"]["first"]
    # The planted node, or the node that completes its module's operation (swish is Sigmoid then Mul; PyTorch's SiLU
    # gives only the product to compare with).
    assert first["module"] == f"model.decoder.layers.{layers - 1}.{module}" == _origin(out, planted)
    assert _origin(out, first["node"]) == first["module"]
    assert f"first divergent node: {first['node']}" in result.output


def test_a_pickle_in_place_of_weights_is_refused_and_never_run(cli, shared, tmp_path):
    hf, _ = shared
    evil = tmp_path / "evil"
    shutil.copytree(hf, evil)
    (evil / "model.safetensors").unlink()
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (ran,))

    torch.save({"model.shared.weight": Payload()}, evil / "pytorch_model.bin")
    result = cli("export", f"hf:{evil}", "--out", tmp_path / "out")
    assert not ran.exists()
    assert "holds its weights only as pytorch_model.bin, a pickle: tk never unpickles" in one_line_error(result, 2)


def test_tensors_only_pytorch_weights_are_refused_too(cli, shared, tmp_path):
    """Even a pickle of tensors alone: torch's weights_only loader still runs a pickle machine over the file. The line
    says how to get safetensors (tests/pytorch/test_hf_marian_family.py: beside them, a .bin is ignored)."""
    from safetensors.torch import load_file

    hf, out = shared
    binary = tmp_path / "bin"
    shutil.copytree(hf, binary)
    torch.save(load_file(str(binary / "model.safetensors")), binary / "pytorch_model.bin")
    (binary / "model.safetensors").unlink()
    line = one_line_error(cli("export", f"hf:{binary}", "--out", tmp_path / "out"), 2)
    assert "convert it to safetensors" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("spoil, expected", [
    (lambda d: _edit_json(d / "config.json", model_type="bert"), "has model_type 'bert'; tk imports BartForConditionalGeneration"),
    (lambda d: (d / "vocab.json").unlink(), "has no vocab.json; save the MarianTokenizer beside the model"),
    (lambda d: _shard_index(d, "../outside.safetensors"), "refusing file name '../outside.safetensors'"),
    (lambda d: _link_out(d), "outside the Hugging Face directory; copy the file into it"),
    (lambda d: _edit_json(d / "config.json", d_model="64"), "d_model must be a whole number, got '64'"),
    (lambda d: _edit_json(d / "config.json", activation_function="mish"), "activation_function 'mish' is not one tk exports"),
    (lambda d: (d / "config.json").write_text("{"), "config.json is not readable JSON"),
    (lambda d: _edit_json(d / "config.json", d_model=10**6), "d_model must be at most 1024 (the largest tk builds)"),
])
def test_a_broken_or_hostile_hugging_face_directory_is_one_line(cli, shared, tmp_path, spoil, expected):
    hf, _ = shared
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    spoil(bad)
    result = cli("export", f"hf:{bad}", "--out", tmp_path / "out")
    assert expected in one_line_error(result, 2)
    assert not (tmp_path / "out").exists()


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _shard_index(directory: Path, name: str) -> None:
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": name}}))


def _link_out(directory: Path) -> None:
    outside = directory.parent / "elsewhere.safetensors"
    (directory / "model.safetensors").rename(outside)
    (directory / "model.safetensors").symlink_to(outside)


def test_the_imported_model_runs_through_translate_and_the_torch_free_deploy_path(marian, pairs, assert_torch_free, tmp_path):
    _, out = marian
    src = tmp_path / "in.txt"
    src.write_text("\n".join(_held_out(pairs, 5)) + "\n", encoding="utf-8")
    assert_torch_free("translate", "--model", out, "-i", src, "--beam", 4, "-o", tmp_path / "fr.txt")
    assert len((tmp_path / "fr.txt").read_text(encoding="utf-8").splitlines()) == 5


def test_forbidden_tokens_are_declared_in_the_decoder_graph(marian):
    """The generation config's bad_words_ids (opus-mt's forbid <pad>) are -inf in every step's log-probabilities."""
    import onnxruntime as ort

    from toolkit.core import manifest
    from toolkit.core.decoding import empty_cache

    _, out = marian
    m = manifest.load(out)
    specs = m.specs()
    encoder = ort.InferenceSession(str(out / "encoder.onnx"))
    decoder = ort.InferenceSession(str(out / "decoder.onnx"))
    src, src_len = np.array([[5, 6, 7, m.rules().end]], np.int64), np.array([4], np.int64)
    encoded = dict(zip(specs["encoder"].output_names, encoder.run(None, {"src": src, "src_len": src_len})))
    feeds = {"token": np.array([m.rules().start], np.int64), "src_len": src_len, **encoded, **empty_cache(specs["decoder"], encoded, 1)}
    log_probs = decoder.run(["log_probs"], {n: feeds[n] for n in specs["decoder"].input_names})[0]
    assert m.config["suppress_tokens"] == str(m.rules().pad)
    assert np.isneginf(log_probs[0, m.rules().pad]) and np.isfinite(np.delete(log_probs[0], m.rules().pad)).all()


def test_variants_and_openvino_run_an_imported_model(cli, shared, pairs, tmp_path):
    """int8 and fp16 stored beside the graphs, then verified (int8's translations may differ: it is held to its
    tolerances); OpenVINO translates it. The quantiser transposed the output layer's weight in place, under the tied
    embedding's lookup, until that lookup got a table of its own."""
    hf, out = shared
    directory = tmp_path / "variants"
    shutil.copytree(out, directory)
    for option in ("--quantize", "--fp16"):
        result = cli("export", directory, *((option, "int8") if option == "--quantize" else (option,)))
        assert result.exit_code == 0, result.output
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--variant", "int8", "--sentences", 8)
    assert result.exit_code == 0, result.output
    english = _held_out(pairs, 8)
    result = cli("translate", "--model", directory, "--runtime", "openvino", *english)
    assert result.exit_code == 0, result.output


def test_an_imported_model_gets_its_sentences_as_they_are(cli, shared):
    """tk's placeholders and case folding are what tk's models were trained on; an imported model gets each cleaned
    sentence as it is (a number stays in its sentence), and --keep, which needs placeholders, is refused in one line."""
    from toolkit import Translator

    _, out = shared
    t = Translator(out)
    line = "I have 3 cats.  WHERE IS THE STATION?"
    plain = dict(raw=True, loop_guard=False, max_len_a=None)
    assert t.translate([line], loop_guard=False, max_len_a=None) == [" ".join(t.translate(["I have 3 cats.", "WHERE IS THE STATION?"], **plain))]
    assert "was not trained to copy" in one_line_error(cli("translate", "--model", out, "--keep", "Paris", "I love Paris."), 2)


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])
