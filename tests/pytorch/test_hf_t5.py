"""Hugging Face T5ForConditionalGeneration (T5, Flan-T5, mT5) in: `tk export hf:DIR`, verify, translate with a task
prefix, localize, untrusted tensors.

Two tiny models built here from their config classes (no download), each trained a few dozen steps en -> fr so that
outputs end at lengths of their own: a T5 v1.0 (relu feed-forward, tied and rescaled output layer, spiece.model only,
trained on "translate English to French: " sources) and an mT5/Flan-T5-style one (gated-gelu, an lm_head of its own,
no rescaling, tokenizer.json as transformers 5 saves it, trained on raw sources). d_kv is not d_model / heads in
either, so tk's cache layout must take T5's own head size.
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from conftest import built_once
from helpers import check_int8_and_openvino, one_line_error
from hf_marian_fixture import fra_eng_lines, train_briefly
from verify.test_localize import _edit_decoder

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

PREFIX = "translate English to French: "
TASKS = {"translation_en_to_fr": {"prefix": PREFIX}, "translation_en_to_de": {"prefix": "translate English to German: "},
         "summarization": {"prefix": "summarize: "}}
EXTRA_IDS = 8


def _spiece(lines: list[str]) -> bytes:
    """T5's SentencePiece layout: <pad> 0, </s> 1, <unk> 2, no <s>; its ids are the model's."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=200, model_type="unigram",
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2,
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    return out.getvalue()


def t5_directory(path: Path, pairs: list[tuple[str, str]], *, mt5: bool, steps: int = 150, seed: int = 0) -> Path:
    """Writes a tiny trained T5 (mt5=False: relu, tied, spiece.model, prefixed sources) or mT5-style model (gated-gelu,
    untied lm_head, tokenizer.json, raw sources) with its tokenizer into `path`."""
    from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration, T5Tokenizer

    path.mkdir(parents=True, exist_ok=True)
    (path / "spiece.model").write_bytes(_spiece([e for e, _ in pairs] + [f for _, f in pairs] + [PREFIX]))
    (path / "tokenizer_config.json").write_text(json.dumps({"extra_ids": EXTRA_IDS, "tokenizer_class": "T5Tokenizer"}))
    tokenizer = T5Tokenizer.from_pretrained(path, extra_ids=EXTRA_IDS)
    if mt5:  # tokenizer.json: transformers 5 saves it alone; 4's fast tokenizer saves it beside spiece.model (as Hub repos)
        tokenizer.save_pretrained(path)
        if (path / "tokenizer.json").is_file():
            (path / "spiece.model").unlink(missing_ok=True)
        else:
            from transformers import T5TokenizerFast

            T5TokenizerFast.from_pretrained(path, extra_ids=EXTRA_IDS).save_pretrained(path)
    torch.manual_seed(seed)
    sizes = dict(vocab_size=len(tokenizer) + 4, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                 num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                 decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, n_positions=64, task_specific_params=TASKS)
    if mt5:
        model = MT5ForConditionalGeneration(MT5Config(**sizes, feed_forward_proj="gated-gelu"))
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())  # an lm_head of its own
    else:
        model = T5ForConditionalGeneration(T5Config(**sizes, feed_forward_proj="relu"))
    sources = [e if mt5 else PREFIX + e for e, _ in pairs]
    train_briefly(model, tokenizer, sources, [f for _, f in pairs], steps, seed)
    model.generation_config.max_length = 24
    model.generation_config.num_beams = 4
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


def _built(tmp_path_factory, pairs, name: str, mt5: bool) -> tuple[Path, Path]:
    from click.testing import CliRunner

    from toolkit.cli import main

    def build(root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t5_directory(root / "hf", pairs[:400], mt5=mt5)
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    root = built_once(tmp_path_factory, name, build)
    return root / "hf", root / "tk"


@pytest.fixture(scope="module")
def t5(tmp_path_factory, pairs) -> tuple[Path, Path]:
    """(Hugging Face T5 directory, tk model directory exported from it), built once per run."""
    return _built(tmp_path_factory, pairs, "hf-t5", mt5=False)


@pytest.fixture(scope="module")
def mt5(tmp_path_factory, pairs) -> tuple[Path, Path]:
    return _built(tmp_path_factory, pairs, "hf-mt5", mt5=True)


def _held_out(pairs, n: int = 40) -> list[str]:
    return [e for e, _ in pairs[1000: 1000 + n]]


def _generate(hf: Path, texts: list[str], beam: int) -> tuple[list[str], torch.Tensor]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False)
    return tokenizer.batch_decode(out, skip_special_tokens=True), out


def _agreement(got: list[str], want: list[str], out: torch.Tensor) -> tuple[int, int]:
    """(identical, compared) over generate's outputs that end before the length limit (a cut one may differ in the
    tie the limit breaks)."""
    ended = [1 in row[1:].tolist() for row in out]
    compared = [(a, b) for a, b, e in zip(got, want, ended) if e]
    return sum(a == b for a, b in compared), len(compared)


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam, share", [(1, 0.97), (4, 0.90)])
def test_translations_with_the_task_prefix_are_generates(t5, pairs, beam, share):
    from toolkit import Translator

    hf, out = t5
    english = _held_out(pairs)
    want, ids = _generate(hf, [PREFIX + e for e in english], beam)
    got = Translator(out).translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None, source_lang="en", target_lang="fr")
    same, compared = _agreement(got, want, ids)
    assert compared >= 20 and same >= share * compared, (same, compared)
    assert len(set(want)) > 5  # the model says different things, which end at lengths of their own


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam, share", [(1, 0.97), (4, 0.90)])
def test_an_untied_gated_gelu_mt5_translates_raw_text_as_generate(mt5, pairs, beam, share):
    from toolkit import Translator

    hf, out = mt5
    english = _held_out(pairs)
    want, ids = _generate(hf, english, beam)
    got = Translator(out).translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None)
    same, compared = _agreement(got, want, ids)
    assert compared >= 20 and same >= share * compared, (same, compared)
    assert len(set(want)) > 5
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert (config["model_type"], config["tie_word_embeddings"], config["scale_decoder_outputs"]) == ("mt5", False, False)


@pytest.mark.transformers_lines
def test_the_tokenizer_gives_t5_tokenizer_ids(t5, mt5, pairs):
    """spiece.model (sentencepiece) and tokenizer.json (the tokenizers library), with and without the task prefix."""
    from transformers import AutoTokenizer

    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer, with_languages

    texts = [e for e, _ in pairs[:300]] + ["<extra_id_0> is a sentinel", "  two  spaces ", "Ünïcödé, 123!"]
    for hf, out in (t5, mt5):
        m = manifest.load(out)
        theirs = AutoTokenizer.from_pretrained(hf)
        ours = open_tokenizer(m)
        assert ours.encode(texts) == [theirs(t)["input_ids"] for t in texts]
        _, prefixed = with_languages(m, ours, "en", "fr")
        assert prefixed.encode(texts[:50]) == [theirs(PREFIX + t)["input_ids"] for t in texts[:50]]
        ids = [theirs(t)["input_ids"] for t in texts[:50]]
        assert ours.decode(ids) == theirs.batch_decode(ids, skip_special_tokens=True)
    assert manifest.load(t5[1]).declared().tokenizer.source == "spiece.model"
    assert manifest.load(mt5[1]).declared().tokenizer.source == "tokenizer.json"


def test_export_with_a_pair_applies_its_prefix_and_an_unknown_pair_is_one_line(cli, t5, pairs, tmp_path):
    from toolkit import Translator
    from toolkit.core import manifest
    from toolkit.core.errors import UsageError
    from toolkit.core.tokenizers import open_tokenizer

    hf, out = t5
    assert manifest.load(out).declared().tokenizer.prefixes == {"en-fr": PREFIX, "en-de": "translate English to German: "}
    directory = tmp_path / "en-fr"
    result = cli("export", f"hf:{hf}", "--out", directory, "--source-lang", "en", "--target-lang", "fr")
    assert result.exit_code == 0, result.output
    english = _held_out(pairs, 10)
    assert open_tokenizer(manifest.load(directory)).encode(english) == open_tokenizer(manifest.load(out)).encode([PREFIX + e for e in english])
    assert Translator(directory).translate(english, raw=True) == Translator(out).translate(english, raw=True, source_lang="en", target_lang="fr")
    with pytest.raises(UsageError, match=r"no task prefix for en to ro; its config.json's task_specific_params declares en-de, en-fr"):
        Translator(out).translate(["Hello."], source_lang="en", target_lang="ro")
    error = one_line_error(cli("translate", "--model", out, "--source-lang", "fr", "--target-lang", "en", "Salut."), 2)
    assert "no task prefix for fr to en" in error and "en-de, en-fr" in error
    error = one_line_error(cli("export", f"hf:{hf}", "--out", tmp_path / "xx", "--source-lang", "en", "--target-lang", "ro"), 2)
    assert "no task prefix for en to ro" in error and "en-de, en-fr" in error
    assert not (tmp_path / "xx").exists()  # refused before any export work: nothing written


@pytest.mark.transformers_lines
@pytest.mark.parametrize("which", ["t5", "mt5"])
def test_verify_holds_the_graphs_to_generate(cli, t5, mt5, which, tmp_path):
    hf, out = t5 if which == "t5" else mt5
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 16, "--json", report)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def _relu_to_tanh(graph) -> str:
    """The last decoder block's feed-forward activation (relu) turned into Tanh."""
    node = [n for n in graph.node if n.op_type == "Relu"][-1]
    node.op_type = "Tanh"
    return node.name


def test_a_swapped_activation_fails_verify_and_localize_names_the_transformers_module(cli, t5, tmp_path):
    hf, out = t5
    directory, _ = _edit_decoder(out, tmp_path, _relu_to_tanh)
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 4, "--json", report)
    assert result.exit_code == 1, result.output
    layers = json.loads((out / "manifest.json").read_text())["config"]["decoder_layers"]
    assert json.loads(report.read_text())["localization"]["first"]["module"] == f"decoder.block.{layers - 1}.layer.2.DenseReluDense.act"


def _bucket_shifted(graph) -> str:
    """The decoder's relative-bias bucket of each position moved by one: the Gather that looks the buckets up in the
    bias table gets its indices through an Add of one (clipped to the table), the fault of a bucket rule off by one."""
    from onnx import helper, numpy_helper

    gather = next(n for n in graph.node if n.op_type == "Gather" and "relative_attention_bias" in n.input[0])
    one = numpy_helper.from_array(__import__("numpy").array(1, dtype="int64"), "planted_one")
    top = numpy_helper.from_array(__import__("numpy").array(7, dtype="int64"), "planted_top")
    graph.initializer.extend([one, top])
    added, clipped = "planted_bucket_plus_one", "planted_bucket_clipped"
    at = list(graph.node).index(gather)
    graph.node.insert(at, helper.make_node("Min", [added, "planted_top"], [clipped], name="planted_min"))
    graph.node.insert(at, helper.make_node("Add", [gather.input[1], "planted_one"], [added], name="planted_add"))
    gather.input[1] = clipped
    return gather.name


def test_a_changed_relative_bias_bucket_fails_verify_and_localize_names_the_bias(cli, t5, tmp_path):
    hf, out = t5
    directory, _ = _edit_decoder(out, tmp_path, _bucket_shifted)
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 4, "--json", report)
    assert result.exit_code == 1, result.output
    module = json.loads(report.read_text())["localization"]["first"]["module"]
    assert module.startswith("decoder.block.0.layer.0.SelfAttention"), module


def test_a_wrong_shaped_tensor_is_refused_in_one_line_before_building(cli, t5, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    from toolkit.pytorch import hf_t5

    hf, _ = t5
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    state = load_file(bad / "model.safetensors")
    name = "decoder.block.1.layer.0.SelfAttention.k.weight"
    state[name] = torch.zeros(state[name].shape[0] + 1, state[name].shape[1])
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    built = []
    monkeypatch.setattr(hf_t5, "build", lambda settings: built.append(settings))
    error = one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "out"), 2)
    assert f"weight {name} has shape (65, 32), the config gives (64, 32)" in error and not built


def test_a_config_tk_cannot_build_is_one_line(cli, t5, tmp_path):
    hf, _ = t5
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "feed_forward_proj": "gated-mish"}))
    assert "feed_forward_proj 'gated-mish' is not one tk exports" in one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "o"), 2)
    (bad / "config.json").write_text(json.dumps({**config, "d_kv": 0}))
    assert "d_kv must be at least 1, got 0" in one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "o"), 2)


def test_int8_and_openvino_run_an_imported_t5(cli, t5, pairs, tmp_path):
    """Guarded int8 stored beside the graphs and verified (held to its tolerances), and OpenVINO giving ONNX Runtime's
    text with the pair's task prefix: the paths docs/models.md marks measured for t5."""
    hf, out = t5
    check_int8_and_openvino(cli, hf, out, _held_out(pairs, 6), tmp_path)


def test_float16_is_refused_in_one_line_by_every_command_that_would_make_it(cli, t5, tmp_path):
    """A plain float16 T5 graph overflows where transformers clamps (its feed-forward outputs pass 65,504): export,
    adding the variant, translate and verify each refuse it in one line, before any work and with nothing written."""
    hf, out = t5
    error = one_line_error(cli("export", f"hf:{hf}", "--out", tmp_path / "fp16", "--fp16"), 2)
    assert "overflow float16" in error and "--quantize int8" in error
    assert not (tmp_path / "fp16").exists()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert "overflow float16" in one_line_error(cli("export", copy, "--fp16"), 2)
    assert not list(copy.glob("*.fp16.onnx")) and "fp16" not in json.loads((copy / "manifest.json").read_text())["variants"]
    assert "overflow float16" in one_line_error(cli("translate", "--model", copy, "--variant", "fp16", "Hello."), 2)
    assert "overflow float16" in one_line_error(cli("verify", copy, "--variant", "fp16"), 2)


@pytest.mark.parametrize("which", ["t5", "mt5"])
def test_ctranslate2_converts_verifies_and_translates_an_imported_t5(cli, t5, mt5, pairs, which, tmp_path):
    """`--runtime ctranslate2` on T5 (relu, tied head scaled by d_model^-0.5, the pair's task prefix) and mT5 (gated-gelu,
    an lm_head of its own), both with d_kv * heads != d_model: verified against hf:, generate's greedy text, and swapped
    cross-attention keys and values failing verify."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    from helpers import check_ctranslate2

    hf, out = t5 if which == "t5" else mt5
    english = _held_out(pairs)
    want, ids = _generate(hf, [PREFIX + e for e in english] if which == "t5" else english, 1)
    ended = [1 in row[1:].tolist() for row in ids]  # a sentence cut at the limit may end on a tie the limit breaks
    english, want = [e for e, k in zip(english, ended) if k], [w for w, k in zip(want, ended) if k]
    layer = "decoder.block.0.layer.1.EncDecAttention"
    check_ctranslate2(cli, hf, out, english, want, tmp_path, (f"{layer}.k.weight", f"{layer}.v.weight"),
                      **({"source_lang": "en", "target_lang": "fr"} if which == "t5" else {}))


# Directories whose output layer the two transformers lines compute differently. transformers 5 writes
# tie_word_embeddings true for every T5 and mT5 (it always ties lm_head to the embedding) and says whether the decoder
# output is rescaled by d_model**-0.5 before lm_head in scale_decoder_outputs: false for a T5 configured untied
# (T5Config(tie_word_embeddings=False), as T5 v1.1 and Flan-T5 are), and an mT5 is never rescaled. transformers 4
# rescales a T5 or an mT5 whenever tie_word_embeddings is true. The rescaling is a temperature on the logits: both lines
# give the same greedy tokens and other beam-search scores.
READ_APART = {"t5 saved unscaled": {"tie_word_embeddings": True, "scale_decoder_outputs": False},
              "mt5 saved tied": {"tie_word_embeddings": True, "model_type": "mt5", "architectures": ["MT5ForConditionalGeneration"]}}


def _read_apart(t5_hf: Path, directory: Path, fields: dict) -> Path:
    """A copy of the `t5` fixture's directory with the config.json fields `fields` (scale_decoder_outputs dropped where
    they do not give it: an mT5's config has none)."""
    shutil.copytree(t5_hf, directory)
    config = json.loads((directory / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    (directory / "config.json").write_text(json.dumps({**config, **fields}))
    return directory


def _generate_rescaled(hf: Path, texts: list[str], beam: int, factor: float) -> list[str]:
    """generate on `hf` as loaded by this transformers, with the decoder output times `factor` before lm_head: the output
    layer as the other transformers line computes it."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
    model.lm_head.register_forward_pre_hook(lambda module, args: (args[0] * factor,))
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.mark.transformers_lines
@pytest.mark.parametrize("kind", sorted(READ_APART))
def test_beam_search_is_the_installed_transformers_generate_where_the_lines_compute_the_output_layer_apart(cli, t5, pairs, kind, tmp_path):
    """Exported and translated under this transformers line, beam 4 gives this line's generate; the other line's output
    layer (rescaled where this one is not, or the reverse) gives other beams on these sentences, so following it fails."""
    import transformers

    from toolkit import Translator

    hf = _read_apart(t5[0], tmp_path / "hf", READ_APART[kind])
    out = tmp_path / "tk"
    result = cli("export", f"hf:{hf}", "--out", out)
    assert result.exit_code == 0, result.output
    english = _held_out(pairs)
    texts = [PREFIX + e for e in english]
    want, ids = _generate(hf, texts, 4)
    got = Translator(out).translate(english, beam=4, raw=True, loop_guard=False, max_len_a=None, source_lang="en", target_lang="fr")
    same, compared = _agreement(got, want, ids)
    assert compared >= 20 and same >= 0.90 * compared, (transformers.__version__, same, compared)
    d_model = json.loads((hf / "config.json").read_text())["d_model"]
    this_line_rescales = int(transformers.__version__.split(".")[0]) < 5
    other_line = _generate_rescaled(hf, texts, 4, d_model ** (0.5 if this_line_rescales else -0.5))
    wrong, _ = _agreement(other_line, want, ids)
    assert wrong < 0.90 * compared, (wrong, compared)  # the other line's rule would fail the assertion above
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 16, "--json", report)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def _deeper_decoder(t5_hf: Path, directory: Path) -> Path:
    """The `t5` fixture's tokenizer beside a random T5 of one encoder layer and two decoder layers, as T5-efficient's DL
    variants give the decoder more layers than the encoder. transformers' generate sizes its cache by the encoder's
    count and fails on it (IndexError in cache_utils, on both lines); its forward runs."""
    from transformers import T5Config, T5ForConditionalGeneration

    shutil.copytree(t5_hf, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_layers": 1, "num_decoder_layers": 2}))
    torch.manual_seed(0)
    T5ForConditionalGeneration(T5Config.from_pretrained(directory)).save_pretrained(directory)
    return directory


@pytest.mark.transformers_lines
def test_verify_of_a_t5_whose_generate_cannot_run_says_so_in_one_line_and_fails_only_when_strict(cli, t5, tmp_path):
    """generate failing inside transformers is no fault of the graphs: verify names the failure and what it checked in
    its place (every graph against PyTorch's forward, tk's greedy and beam tokens over the graphs against tk's decode
    over PyTorch), exits 0 when those pass, and 1 with --strict."""
    hf = _deeper_decoder(t5[0], tmp_path / "hf")
    out = tmp_path / "tk"
    result = cli("export", f"hf:{hf}", "--out", out)
    assert result.exit_code == 0, result.output
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 6, "--json", report)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    said = [line for line in result.output.splitlines() if "generate" in line and line.startswith("warning:")]
    assert len(said) == 1, result.output
    assert "generate cannot run on this model (greedy and beam 4: IndexError: " in said[0], said[0]
    assert "raised inside transformers" in said[0] and "in its place" in said[0] and "--strict" in said[0], said[0]
    data = json.loads(report.read_text())
    assert data["passed"] and data["warnings"] == [said[0].removeprefix("warning: ")]
    assert not [r for r in data["rows"] if r["check"] == "generate"]
    beams = [r for r in data["rows"] if r["check"] == "translation" and r["output"] == "beam 4 tokens"]
    assert beams and all(r["ok"] and r["detail"].startswith("6/6 identical") for r in beams), beams
    error = one_line_error(cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 6, "--strict"), 1)
    assert "generate" in error and "IndexError" in error, error


@pytest.mark.transformers_lines
def test_verify_under_the_other_transformers_line_says_the_lines_differ_not_that_the_model_does(cli, t5, tmp_path, monkeypatch):
    """A model exported under one line and verified under the other, from a directory the lines read apart: one line
    naming the field and what to do, not "another model" (the weights and the directory are the same)."""
    from toolkit.pytorch import hf_t5

    hf = _read_apart(t5[0], tmp_path / "hf", READ_APART["t5 saved unscaled"])
    out = tmp_path / "tk"
    result = cli("export", f"hf:{hf}", "--out", out)
    assert result.exit_code == 0, result.output
    other = 9 - hf_t5.transformers_line()  # 4 <-> 5
    monkeypatch.setattr(hf_t5, "transformers_line", lambda: other)
    error = one_line_error(cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 2), 2)
    assert "builds" in error and "scale_decoder_outputs" in error and "4.x and 5.x read this config.json apart" in error, error
    assert "re-export it under this transformers, or verify under the line it was exported with" in error, error
