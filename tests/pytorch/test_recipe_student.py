"""The student recipe without a GPU (a deep encoder over a shallow decoder, within 10M parameters and the
exported/ budget), the copy pairs that teach names, the name test set kept apart from training, and a CPU dry run of
the whole recipe at toy size: the loss falls, an interrupted run resumes from its checkpoint, and the result exports
and passes `tk verify` on ONNX Runtime and on CTranslate2 (whose converter must build 2 encoder layers and 1 decoder layer)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from toolkit.models.transformer import Transformer, TransformerConfig

import toolkit.pytorch.train
from toolkit.cli import main
from toolkit.core import architectures, copydata, data, manifest, noise
from toolkit.core.declaration import self_attention_cache, transformer_layers
from toolkit.deploy import names
from toolkit.pytorch import checkpoint, registry, tk_models
from toolkit.pytorch.train import PRESETS, TrainOptions, config_fields

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"
SIZE_BUDGET = 40 * 2**20  # tests/test_shipped.py


def _script(name: str, folder: str = "docs"):
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


student_gpu = _script("student_gpu", "tools")


def tk(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def student_config() -> TransformerConfig:
    entry = registry.get("transformer")
    fields = config_fields(TrainOptions(model="transformer", out=Path("unused"), preset="student"), entry)
    return entry.config(**fields)


# ---- the recipe ------------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_the_student_is_a_deep_encoder_over_a_shallow_decoder_within_10m_parameters_and_the_budget():
    cfg = student_config()
    assert (cfg.num_layers, cfg.decoder_layers, cfg.num_hiddens, cfg.vocab_size) == (6, 2, 256, 6000)
    recipe = PRESETS["student"]
    assert recipe["label_smoothing"] == 0.1 and recipe["noise"] and recipe["copy_rate"] > 0 and recipe["average_last"] > 1
    assert recipe["epochs"] > 30  # longer than the shipped recipe's 30
    model = Transformer(cfg)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == student_gpu.parameters(dataclasses.asdict(cfg)) == 7_320_576
    assert counted <= 10_000_000
    assert [n for n, p in model.named_parameters() if p.shape[0] == cfg.vocab_size] == ["embedding.weight"]  # tied: one table
    # The formula holds for the shipped model too (its weights.bin: every parameter and the positional table).
    shipped = manifest.load(SHIPPED)
    assert student_gpu.weights_bytes(shipped.config) == (SHIPPED / "weights.bin").stat().st_size
    # exported/ with the student in place of the shipped Transformer: its weights, and graphs and node maps that grow
    # with the layers they hold (the encoder's with 6 of 3, the decoder's with 2 of 3), stay within the budget.
    files = {p.name: p.stat().st_size for p in SHIPPED.iterdir()}
    graphs = 2 * (files["encoder.onnx"] + files["encoder.nodes.json"]) + (files["decoder.onnx"] + files["decoder.nodes.json"])
    student_dir = student_gpu.weights_bytes(dataclasses.asdict(cfg)) + graphs + sum(
        size for name, size in files.items() if not name.startswith(("encoder.", "decoder.", "weights.bin")))
    projected = student_gpu.tree_bytes(REPO / "exported") - student_gpu.tree_bytes(SHIPPED) + student_dir
    assert projected + 256 * 2**10 <= SIZE_BUDGET, f"{projected / 2**20:.2f} MiB"
    # The same sizes with a 1,024-wide FFN (8.4M parameters, within 10M) would not fit: the budget is what binds.
    wider = {**dataclasses.asdict(cfg), "ffn_num_hiddens": 1024}
    assert student_gpu.parameters(wider) <= 10_000_000
    assert projected - student_gpu.weights_bytes(dataclasses.asdict(cfg)) + student_gpu.weights_bytes(wider) > SIZE_BUDGET


@pytest.mark.timeout(30)
def test_the_student_preset_is_the_transformers_only(tmp_path):
    result = tk("train", "seq2seq", "--preset", "student", "--out", tmp_path / "run")
    assert result.exit_code == 2 and "--preset student is a recipe for transformer only" in result.output
    result = tk("train", "transformer", "--preset", "student", "--out", tmp_path / "run", "--set", "copy_rate=1.5")
    assert result.exit_code == 2 and "copy_rate must be from 0 to 1.0" in result.output
    assert not (tmp_path / "run").exists()


# ---- a separate decoder depth, everywhere the config is read -----------------------------------------------

@pytest.mark.timeout(30)
def test_decoder_layers_reach_the_model_graphs_cache_check_and_converters():
    entry = registry.get("transformer")
    cfg = entry.config(vocab_size=50, num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_layers=3, decoder_layers=1)
    model = Transformer(cfg)
    assert (len(model.encoder_blocks), len(model.decoder_blocks)) == (3, 1)
    encoder, decoder = tk_models.transformer_graphs(cfg)
    assert set(decoder.updates.values()) == self_attention_cache(1)
    assert [t.name for t in encoder.outputs] == ["memory", "cross_k_0", "cross_v_0"]
    attention = tk_models.transformer_attention(cfg)
    assert (len(attention["encoder"]), len(attention["decoder"])) == (3, 2)
    # --set decoder_layers=N is parsed as an integer and bounded like num_layers.
    assert entry.parse_overrides({"decoder_layers": "2"}, {}) == {"decoder_layers": 2}
    with pytest.raises(Exception, match="expected an integer"):
        entry.parse_overrides({"decoder_layers": "two"}, {})
    with pytest.raises(Exception, match="decoder_layers must be at most 48"):
        entry.checked_config({"num_layers": 2, "decoder_layers": 49}, "ckpt")
    # The decoder's cache follows decoder_layers in the manifest check; a manifest that says otherwise is refused.
    config = dataclasses.asdict(cfg)
    assert transformer_layers(config) == (3, 1)
    cache = architectures.get("transformer").cache
    assert cache(config) == self_attention_cache(1) and cache({**config, "decoder_layers": 3}) != cache(config)
    # CTranslate2 and Hugging Face take the two depths as they are.
    from toolkit.convert import to_hf

    hf = to_hf.marian_config({**config, "max_len": 64})
    assert (hf["encoder_layers"], hf["decoder_layers"]) == (3, 1)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    tensors = to_hf.marian_tensors(weights, config)
    layers = {side: {int(m.group(1)) for k in tensors if (m := re.match(rf"model\.{side}\.layers\.(\d+)\.", k))} for side in ("encoder", "decoder")}
    assert layers == {"encoder": {0, 1, 2}, "decoder": {0}}


@pytest.mark.timeout(30)
def test_old_configs_and_the_shipped_manifest_load_unchanged():
    shipped = manifest.load(SHIPPED)  # the student: 6 encoder layers, 2 decoder layers
    assert transformer_layers(shipped.config) == (shipped.config["num_layers"], shipped.config["decoder_layers"]) == (6, 2)
    cfg = registry.get("transformer").checked_config(shipped.config, "shipped")
    assert len(Transformer(cfg).decoder_blocks) == 2
    # A manifest written before decoder_layers existed (the 3 + 3 model shipped before) reads as equal stacks.
    before = {k: v for k, v in shipped.config.items() if k != "decoder_layers"}
    assert transformer_layers({**before, "num_layers": 3}) == (3, 3)
    assert registry.get("transformer").checked_config({**before, "num_layers": 3}, "before").decoder_layers == 3
    # A checkpoint written before decoder_layers existed (its config has none) builds the model it was.
    state = Transformer(TransformerConfig(vocab_size=40, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_layers=2)).state_dict()
    old = {"model": "transformer", "config": {"vocab_size": 40, "num_hiddens": 8, "ffn_num_hiddens": 16, "num_heads": 2,
                                              "num_layers": 2, "dropout": 0.1, "max_len": 64, "pre_ln": False, "pad_id": 0},
           "state_dict": state}
    _, cfg, model = checkpoint.build_model(old)
    assert cfg.decoder_layers == 2 and len(model.decoder_blocks) == 2


# ---- copy pairs: names swapped on both sides ---------------------------------------------------------------

PAIRS = [
    ("Tom is here.", "Tom est ici."),
    ("I gave the book to Mary.", "J'ai donné le livre à Mary."),
    ("This is Tom's dog.", "C'est le chien de Tom."),
    ("Emily's bag is red.", "Le sac d'Emily est rouge."),
    ("Tom and Mary live in Boston.", "Tom et Mary vivent à Boston."),
    ("I love London.", "J'adore Londres."),
    ("Where is the station?", "Où est la gare ?"),
    ("Thomas is taller than Tom.", "Thomas est plus grand que Tom."),
    ("I saw Emily yesterday.", "J'ai vu Emily hier."),
]


@pytest.mark.timeout(30)
def test_the_corpus_names_are_words_capitalised_identically_on_both_sides():
    found = copydata.corpus_names(PAIRS)
    assert {"Tom", "Mary", "Boston", "Emily"} <= set(found)
    assert not {"London", "Londres", "Where", "I", "This", "Thomas"} & set(found)  # translated, or first words only


@pytest.mark.timeout(30)
def test_french_elision_follows_the_new_name():
    assert copydata.substitute("C'est le chien de Tom.", "Tom", "Ingrid", french=True) == "C'est le chien d'Ingrid."
    assert copydata.substitute("Le sac d'Emily est rouge.", "Emily", "Bralin", french=True) == "Le sac de Bralin est rouge."
    assert copydata.substitute("Il est plus grand que Tom.", "Tom", "Olaf", french=True) == "Il est plus grand qu'Olaf."
    assert copydata.substitute("Thomas et Tom.", "Tom", "Zed") == "Thomas et Zed."  # whole words only


@pytest.mark.timeout(60)
def test_copy_pairs_swap_every_name_on_both_sides_and_never_a_held_out_one():
    pairs = PAIRS * 30
    copies = copydata.CopyData(pairs, rate=0.5, seed=3, pool_size=3000)
    assert copies.known >= {"Tom", "Mary", "Emily", "Boston"} and not copies.known & {"London", "Londres"}
    epoch = copies.epoch_pairs(0)
    assert len(epoch) == round(0.5 * len(pairs))
    assert epoch == copydata.CopyData(pairs, rate=0.5, seed=3, pool_size=3000).epoch_pairs(0)  # a resumed run sees the same pairs
    assert epoch != copies.epoch_pairs(1)
    assert not set(epoch) & set(pairs)  # every copy pair differs from the pair it was made from
    rng, new_names = random.Random(5), set()
    for _ in range(300):
        en, fr = rng.choice(PAIRS)
        made = copies.swap(en, fr, rng)
        if not copydata.names_in(en, fr, copies.known):
            assert made is None  # only pairs that hold a name are copied (never London/Londres, never the station)
            continue
        if made is None:
            continue  # a substitute that clashed with a word of the pair
        en2, fr2, swapped = made
        assert set(swapped) == set(copydata.names_in(en, fr, copies.known))
        for old, new in swapped.items():
            assert not copydata._word(old).search(en2) and not copydata._word(old).search(fr2), (old, en2, fr2)
            assert names.copied(new, en2) and names.copied(new, fr2), (new, en2, fr2)  # on both sides
            assert not noise.is_held_out_name(new)
            new_names.add(new)
        for old, new in swapped.items():  # nothing else changed: swapping back gives the pair again, elision included
            en2, fr2 = copydata.substitute(en2, new, old), copydata.substitute(fr2, new, old, french=True)
        assert (en2, fr2) == (en, fr)
    assert len(new_names) > 100  # many names of many shapes, not a few
    assert any("-" in n for n in new_names) and any(not n.isascii() for n in new_names)
    assert not any(noise.is_held_out_name(n) for n in copies.pool)


@pytest.mark.timeout(60)
def test_epoch_data_adds_the_copy_pairs_each_epoch():
    from toolkit.core.tokenizer import Tokenizer
    from toolkit.pytorch.epoch_data import EpochData

    tok = Tokenizer.load(SHIPPED / "tokenizer.model")
    pairs = PAIRS * 20
    plain = EpochData(pairs, tok, 64, None, seed=0)
    copies = EpochData(pairs, tok, 64, None, seed=0, copy_rate=0.25)
    try:
        assert len(plain.examples(0)) == len(pairs)
        assert len(copies.examples(0)) == len(pairs) + round(0.25 * len(pairs))
        assert copies.examples(0)[: len(pairs)] == plain.examples(0)  # the pairs themselves, then the copies
        assert copies.examples(1) != copies.examples(0)
    finally:
        plain.close()
        copies.close()


# ---- the name test set and its metric ------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_the_name_test_set_is_reproducible_unseen_and_held_out(corpus_zip):
    builder = _script("names_test_set", "tools")
    pairs, digest = data.read_pairs(corpus_zip)
    words = builder.corpus_words(pairs)
    assert (REPO / "docs" / "names-test.tsv").read_text(encoding="utf-8") == builder.render(builder.build(pairs, words), digest)
    cases = names.read_cases(REPO / "docs" / "names-test.tsv")
    assert len(cases) >= 50 and len({c.name for c in cases}) == len(cases) and len({c.english for c in cases}) == len(cases)
    english = {en for en, _ in pairs}
    for c in cases:
        assert noise.is_held_out_name(c.name), c.name  # no substitution in training can produce it
        assert c.name.lower() not in words, c.name  # nor does the corpus hold it, in any split or case
        assert names.copied(c.name, c.english) and names.copied(c.name, c.french)
        source = copydata.substitute(c.english, c.name, c.stock)
        assert source in english and data.split_of(source) == "test", source  # a held-out sentence
    # The noise's and the copy pairs' names never include one (the rule is what keeps them apart).
    held = {c.name for c in cases}
    assert not held & set(noise.training_names(0)) and not held & set(copydata.generated_names(["Alexander", "Tom"], 5000, 0))


@pytest.mark.timeout(30)
def test_names_copied_is_k_of_n_whole_words():
    cases = names.read_cases(REPO / "docs" / "names-test.tsv")[:4]
    outputs = [cases[0].french, cases[1].french.replace(cases[1].name, cases[1].name + "e"), "rien", cases[3].french]
    result = names.score(cases, outputs)
    assert (result["copied"], result["total"]) == (2, 4) and [m["name"] for m in result["missed"]] == [cases[1].name, cases[2].name]
    assert names.describe(result) == "names copied verbatim: 2 of 4 (50%)"
    assert names.copied("Ingrid", "Le sac d'Ingrid.") and not names.copied("Ingrid", "Ingride") and not names.copied("Ingrid", "ingrid")


# ---- the dry run: the recipe at toy size, on CPU --------------------------------------------------------

EPOCHS = 16

TOY = ["--set", "vocab_size=500", "--set", "num_hiddens=32", "--set", "ffn_num_hiddens=64", "--set", "num_layers=2", "--set", "decoder_layers=1",
       "--set", "max_tokens=800", "--set", "warmup=30", "--set", "lr=0.003", "--set", "eval_sentences=4",
       "--set", "average_last=3", "--set", "copy_rate=0.2", "--limit-pairs", 200, "--epochs", EPOCHS]
INTERRUPT_AT = 60  # training steps before the interruption (of about 160)


@pytest.fixture(scope="module")
def toy_corpus(tmp_path_factory, corpus_zip) -> Path:
    """Every 50th line of fra.txt (about 4,600 pairs of every length): split by the same rule, read in no time."""
    import zipfile

    lines = zipfile.ZipFile(corpus_zip).read(data.MEMBER).decode("utf-8").splitlines()
    path = tmp_path_factory.mktemp("toy-corpus") / "fra.txt"
    path.write_text("\n".join(lines[::50]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, toy_corpus, challenge_test):
    """The student recipe at toy size: interrupted after INTERRUPT_AT steps, resumed, finished."""
    out = tmp_path_factory.mktemp("student") / "run"
    args = ["train", "transformer", "--preset", "student", "--out", out, "--data", toy_corpus, "--exclude", challenge_test,
            "--device", "cpu", "--precision", "fp32", "--threads", 1, *TOY]
    original, calls = toolkit.pytorch.train.label_smoothed_nll, {"n": 0}

    def interrupting(log_probs, target, eps):
        calls["n"] += eps > 0  # training steps (validation calls it without smoothing)
        if eps > 0 and calls["n"] == INTERRUPT_AT:
            raise KeyboardInterrupt
        return original(log_probs, target, eps)

    toolkit.pytorch.train.label_smoothed_nll = interrupting
    try:
        first = tk(*args)
    finally:
        toolkit.pytorch.train.label_smoothed_nll = original
    stopped = checkpoint.load(out)
    second = tk(*args, "--resume")
    return {"out": out, "first": first, "stopped": stopped, "second": second, "final": checkpoint.load(out)}


@pytest.mark.timeout(120)
def test_dry_run_loss_falls_and_an_interrupted_run_resumes_from_its_checkpoint(dry_run):
    first, stopped, second, final = dry_run["first"], dry_run["stopped"], dry_run["second"], dry_run["final"]
    assert first.exit_code == 130 and "continue with --resume" in first.output, first.output
    assert stopped["progress"]["step"] == INTERRUPT_AT - 1 and stopped["progress"]["epoch"] < EPOCHS and not stopped["metrics"]
    assert second.exit_code == 0, second.output
    assert "copy pairs 0.2 per pair" in second.output
    assert final["progress"]["epoch"] == EPOCHS and final["progress"]["step"] >= 120  # a few hundred steps in all
    assert len(final["train"]["resumed_with"]) == 1  # the command that resumed it, recorded after the first
    assert final["train"]["recipe"]["copy_rate"] == 0.2 and final["train"]["recipe"]["label_smoothing"] == 0.1
    assert final["train"]["noise"] is not None and final["progress"]["final_weights"] == f"mean of epochs {EPOCHS - 2}-{EPOCHS}"
    assert final["config"]["num_layers"] == 2 and final["config"]["decoder_layers"] == 1
    history = final["progress"]["history"]
    assert len(history) == EPOCHS and [h["epoch"] for h in history] == list(range(1, EPOCHS + 1))
    assert history[-1]["valid_loss"] < history[0]["valid_loss"] - 1.0, [round(h["valid_loss"], 2) for h in history]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert final["metrics"]["valid_loss"] < history[0]["valid_loss"]


@pytest.fixture(scope="module")
def dry_export(dry_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("student-export") / "model"
    result = tk("export", dry_run["out"] / "checkpoint.pt", "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.timeout(180)
def test_dry_run_exports_and_verifies_on_onnx_runtime(dry_export, toy_corpus):
    m = manifest.load(dry_export)
    assert (m.config["num_layers"], m.config["decoder_layers"]) == (2, 1)
    assert set(m.graphs["decoder"].spec["updates"].values()) == self_attention_cache(1)
    result = tk("verify", dry_export, "--data", toy_corpus, "--variant", "fp32", "--sentences", 2)
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output and "translation" in result.output


@pytest.mark.timeout(120)
def test_dry_run_converts_to_ctranslate2_with_its_own_decoder_depth_and_verifies(dry_export, toy_corpus):
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    assert tk("export", dry_export, "--ctranslate2").exit_code == 0
    result = tk("verify", dry_export, "--runtime", "ctranslate2", "--data", toy_corpus, "--sentences", 2)
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output


@pytest.mark.timeout(120)
def test_dry_run_scores_the_unseen_names_through_tk_evaluate(dry_export):
    result = tk("evaluate", dry_export, "--names", REPO / "docs" / "names-test.tsv", "--beam", 1, "--record")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output[result.output.index("{\n"):])
    assert scores["total"] == len(names.read_cases()) and 0 <= scores["copied"] <= scores["total"]
    assert f"names copied verbatim: {scores['copied']} of {scores['total']}" in result.output
    assert manifest.load(dry_export).metrics["names"]["total"] == scores["total"]


# ---- the GPU runbook (tools/student_gpu.py) -------------------------------------------------------------------------------------

def _manifest(challenge4, split4, challenge1, split1, names_share=0.95, cuda=True, config=None):
    ev = {"tatoeba_challenge_beam4": {"bleu": challenge4}, "test_split_beam4": {"bleu_multi_ref": split4},
          "tatoeba_challenge_greedy": {"bleu": challenge1}, "test_split_greedy": {"bleu_multi_ref": split1}}
    return {"config": config or dataclasses.asdict(student_config()),
            "metrics": {"evaluation": ev, "names": {"copied": round(79 * names_share), "total": 79, "share": names_share}},
            "verify": {"onnxruntime/cpu": {"passed": True}, "onnxruntime/cuda": {"passed": cuda}}}


@pytest.mark.timeout(30)
def test_the_ship_rule_and_the_recipe_goals_hold_every_condition():
    shipped = _manifest(43.66, 56.27, 42.81, 55.28)
    fast = ({"file, greedy (fp32)": 2.0, "file, beam 4 (fp32)": 6.0}, {"file, greedy (fp32)": 1.8, "file, beam 4 (fp32)": 5.0})
    good = _manifest(45.3, 56.9, 44.0, 55.9)

    def verdict(student, bench=fast, size=39 * 2**20):
        return {what: ok for _, what, ok, _ in student_gpu.conditions(student, shipped, bench, size)}

    assert all(verdict(good).values())
    assert not all(verdict(_manifest(44.9, 56.9, 44.0, 55.9)).values())  # beats the shipped model, but under 45.0
    assert not all(verdict(_manifest(45.3, 56.0, 44.0, 55.9)).values())  # worse on the held-out split
    assert not all(verdict(_manifest(45.3, 56.9, 42.0, 55.9)).values())  # greedy lower
    assert not all(verdict(_manifest(45.3, 56.9, 44.0, 55.9, names_share=0.85)).values())
    assert not all(verdict(_manifest(45.3, 56.9, 44.0, 55.9, cuda=False)).values())
    assert not all(verdict(good, bench=(fast[0], {**fast[1], "file, beam 4 (fp32)": 6.1})).values())  # slower on CPU
    assert not all(verdict(good, bench=None).values())
    assert not all(verdict(good, size=SIZE_BUDGET + 1).values())
    big = _manifest(45.3, 56.9, 44.0, 55.9, config={**dataclasses.asdict(student_config()), "num_layers": 12})
    assert not all(verdict(big).values())  # 11.3M parameters


@pytest.mark.timeout(30)
def test_pack_and_unpack_carry_files_in_parts_with_their_digests(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("runs/x").mkdir(parents=True)
    payload = random.Random(0).randbytes(50_000)
    Path("runs/x/weights.bin").write_bytes(payload)
    Path("runs/x/manifest.json").write_text("{}")
    index = student_gpu.pack([Path("runs/x/weights.bin"), Path("runs/x/manifest.json")], tmp_path / "out", "m", part_bytes=16_384)
    assert len(index["parts"]) >= 4 and all((tmp_path / "out" / p["file"]).stat().st_size <= 16_384 for p in index["parts"])
    assert sorted(student_gpu.unpack(tmp_path / "out", tmp_path / "back", "m")) == ["runs/x/manifest.json", "runs/x/weights.bin"]
    assert (tmp_path / "back" / "runs/x/weights.bin").read_bytes() == payload
    # Parts written by two calls fit together; a damaged part is refused.
    again = student_gpu.pack([Path("runs/x/weights.bin"), Path("runs/x/manifest.json")], tmp_path / "out2", "m", part_bytes=16_384,
                         parts=(0, 1), work=tmp_path / "work")
    student_gpu.pack([], tmp_path / "out2", "m", part_bytes=16_384, parts=(2, 99), work=tmp_path / "work")
    assert again["sha256"] == index["sha256"]
    assert student_gpu.unpack(tmp_path / "out2", tmp_path / "back2", "m")
    broken = tmp_path / "out" / index["parts"][1]["file"]
    broken.write_bytes(b"x" + broken.read_bytes()[1:])
    with pytest.raises(SystemExit, match="not the part that was packed"):
        student_gpu.unpack(tmp_path / "out", tmp_path / "back3", "m")


@pytest.mark.timeout(60)
def test_the_runbook_starts_resumes_and_finishes_the_run_it_finds(dry_run, monkeypatch, tmp_path):
    """`student_gpu.py train` starts the recipe with the shipped tokenizer and the Challenge set excluded, adds --resume once
    a checkpoint is there, stops asking once the run is done; its slim checkpoint holds the final weights alone."""
    commands = []
    monkeypatch.setattr(student_gpu, "tk", lambda *args, check=True: commands.append([str(a) for a in args]) or 0)
    args = type("Args", (), {"device": "cuda", "minutes": 8.0, "epochs": None})()
    monkeypatch.setattr(student_gpu, "RUN", tmp_path / "fresh")
    with pytest.raises(SystemExit, match="no checkpoint"):
        student_gpu.stage_train(args)  # a fresh run (the stub trains nothing, so no checkpoint follows)
    first = commands[-1]
    assert first[:4] == ["train", "transformer", "--preset", "student"] and "--resume" not in first
    assert first[first.index("--tokenizer") + 1].endswith("exported/transformer/tokenizer.model")
    assert first[first.index("--exclude") + 1].endswith("tatoeba-test-eng-fra.txt") and first[first.index("--max-minutes") + 1] == "8.0"
    unfinished = tmp_path / "unfinished"  # the dry run's checkpoint as it was mid-run: the next call resumes it
    unfinished.mkdir()
    torch.save({**torch.load(dry_run["out"] / "checkpoint.pt", weights_only=True), "metrics": {}}, unfinished / "checkpoint.pt")
    monkeypatch.setattr(student_gpu, "RUN", unfinished)
    student_gpu.stage_train(args)
    at = first.index("--out") + 1
    assert commands[-1] == [*first[:at], str(unfinished), *first[at + 1:], "--resume"]
    monkeypatch.setattr(student_gpu, "RUN", dry_run["out"])
    commands.clear()
    student_gpu.stage_train(args)  # the dry run is finished: nothing to do
    assert commands == [] and student_gpu.progress()["finished"]
    slim = tmp_path / "slim.pt"
    ckpt = student_gpu.write_slim(dry_run["out"] / "checkpoint.pt", slim)
    small = checkpoint.load(slim)
    assert "optimizer" not in small and "train_state_dict" not in small and slim.stat().st_size < (dry_run["out"] / "checkpoint.pt").stat().st_size
    assert all(torch.equal(small["state_dict"][k], v) for k, v in ckpt["state_dict"].items())
