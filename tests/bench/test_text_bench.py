"""`tk bench --text FILE`: tk's API with its defaults against tk on CTranslate2, CTranslate2 itself and the Hugging Face
peers, text in and text out, from one command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.bench.text import Engine, TextRow, read_text, table
from toolkit.core.errors import DataError, UsageError

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "exported" / "transformer"
CHALLENGE = [("I'm home.", "Je suis à la maison."), ("Where is the station?", "Où est la gare ?"),
             ("The cat is sleeping.", "Le chat dort."), ("Call me tomorrow.", "Appelle-moi demain."),
             ("I like apples.", "J'aime les pommes."), ("It is raining.", "Il pleut.")]


def challenge_file(path: Path) -> Path:
    path.write_text("".join(f"eng\tfra\t{en}\t{fr}\n" for en, fr in CHALLENGE), encoding="utf-8")
    return path


def test_a_challenge_file_carries_sources_and_references_and_a_plain_one_takes_reference(tmp_path):
    assert read_text(challenge_file(tmp_path / "t.txt")) == ([en for en, _ in CHALLENGE], [fr for _, fr in CHALLENGE])
    plain = tmp_path / "en.txt"
    plain.write_text("Hello.\n\nGood night.\n", encoding="utf-8")
    assert read_text(plain) == (["Hello.", "Good night."], None)
    ref = tmp_path / "fr.txt"
    ref.write_text("Bonjour.\nBonne nuit.\n", encoding="utf-8")
    assert read_text(plain, ref) == (["Hello.", "Good night."], ["Bonjour.", "Bonne nuit."])
    ref.write_text("Bonjour.\n", encoding="utf-8")
    with pytest.raises(UsageError, match="one reference per line"):
        read_text(plain, ref)
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match="not UTF-8"):
        read_text(tmp_path / "bad.txt")
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(UsageError, match="no sentences"):
        read_text(tmp_path / "empty.txt")


def test_the_cold_start_sentence_is_one_a_command_line_can_carry():
    from toolkit.bench.text import cold_start_sentence

    assert cold_start_sentence(["\x00\x01", "I'm home.", "Go."]) == "I'm home."
    assert cold_start_sentence(["\x00"]) == "Hello."


def test_the_table_says_which_engine_is_faster_and_by_how_much():
    rows = [TextRow("file, greedy", "fp32", 2000, [Engine("tk", 2.0, "defaults", 1.0, 43.8),
                                                   Engine("ctranslate2", 3.0, "1 x 2", 0.99, 43.3)]),
            TextRow("requests, greedy", "int8", 200, [Engine("tk", 0.006), Engine("optimum", 0.003, "torch 2 threads")])]
    lines = table(rows).splitlines()
    assert "1,000 sent/s" in lines[1] and "1.00x" in lines[1] and "100%" in lines[1] and "43.8" in lines[1]
    assert "667 sent/s" in lines[2] and "1.50x" in lines[2] and "99%" in lines[2] and lines[2].startswith(" ")
    assert "6.0 ms" in lines[3] and "3.0 ms" in lines[4] and "0.50x" in lines[4]


@pytest.mark.timeout(600)
def test_one_command_compares_every_row_without_torch(tmp_path):
    """The whole comparison runs from one command, torch-free like the deploy path, and writes every row
    with both sides' times, CTranslate2's threads and backend, and BLEU beside the file rows. --ct2-backend mkl (not
    CTranslate2's choice on an AMD CPU) is what every CTranslate2 model of the run is loaded with."""
    out = tmp_path / "rows.json"
    code = ("import os, sys\nimport ctranslate2\nfrom toolkit.cli import main\n"
            "seen, load = [], ctranslate2.Translator\n"  # CT2_USE_MKL at each load in this process, where CTranslate2 reads it
            "ctranslate2.Translator = lambda *a, **k: (seen.append(os.environ.get('CT2_USE_MKL')), load(*a, **k))[1]\n"
            f"sys.argv = ['tk', 'bench', '--model', {str(MODEL)!r}, '--text', {str(challenge_file(tmp_path / 't.txt'))!r},"
            f" '--requests', '2', '--repeat', '1', '--variant', 'fp32', '--beam', '1', '--ct2-backend', 'mkl', '--json', {str(out)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('loaded with', sorted(set(seen)), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tk defaults here:" in proc.stderr
    assert "loaded with ['1']" in proc.stderr, proc.stderr[-2000:]
    # CTranslate2's version and the matrix products it ran, as it reports them, beside its threads.
    assert re.search(r"CTranslate2 4\.\S+ \(SGEMM MKL, int8 MKL, AVX\S*\) float32 fastest here", proc.stderr), proc.stderr
    assert "CTranslate2 on mkl (--ct2-backend)" in proc.stdout
    rows = json.loads(out.read_text())
    assert {e["name"]: e["backend"] for e in rows[0]["engines"]} == {
        "tk": None, "tk on ctranslate2": {"backend": "mkl", "chosen": "forced", "probe": {}},
        "ctranslate2": {"backend": "mkl", "chosen": "forced", "probe": {}}}
    assert [r["row"] for r in rows] == ["file, greedy", "requests, greedy", "cold start"]
    for r in rows:
        names = [e["name"] for e in r["engines"]]
        assert names[0] == "tk" and "ctranslate2" in names
        assert all(e["seconds"] > 0 for e in r["engines"])
        assert r["tk_speedup"] == {e["name"]: pytest.approx(e["seconds"] / r["engines"][0]["seconds"]) for e in r["engines"]}
    file_row = {e["name"]: e for e in rows[0]["engines"]}
    assert set(file_row) == {"tk", "tk on ctranslate2", "ctranslate2"} and rows[0]["sentences"] == len(CHALLENGE)
    # tk's text handling runs around CTranslate2, and greedy decoding is tk's: tk's translations (a near-tie at most apart)
    assert file_row["tk on ctranslate2"]["same"] >= 1 - 1 / len(CHALLENGE)
    assert all(0 <= e["bleu"] <= 100 for e in file_row.values())
    assert "file, greedy" in proc.stdout and "cold start" in proc.stdout


@pytest.mark.timeout(600)
def test_the_transformers_peer_runs_on_the_model_written_for_hugging_face(cli, tmp_path):
    """transformers' generate over the --to-hf directory, in its own process; a peer the interpreter lacks is named
    and left out, the other rows stand."""
    pytest.importorskip("transformers", reason="the hf extra (in dev) installs transformers")
    out = tmp_path / "rows.json"
    result = cli("bench", "--model", MODEL, "--text", challenge_file(tmp_path / "t.txt"), "--requests", 2, "--repeat", 1,
                 "--variant", "fp32", "--beam", 1, "--peer", "transformers", "--peer", "optimum", "--json", out)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    engines = {e["name"]: e for e in rows[0]["engines"]}
    assert engines["transformers"]["version"].startswith("transformers ") and engines["transformers"]["seconds"] > 0
    # The exported MarianMTModel generates tk's greedy translations (tk's text handling changes none of these lines).
    assert engines["transformers"]["same"] >= 1 - 1 / len(CHALLENGE)
    assert "transformers" in {e["name"] for e in rows[1]["engines"]}
    if "optimum" not in engines:  # no Optimum beside this transformers: said in one line, the other rows stand
        assert re.search(r"optimum: (optimum is not installed|cannot import it) ", result.output)


def test_a_bad_text_file_is_one_line_and_exit_2(cli, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    result = cli("bench", "--text", tmp_path / "bad.txt", "--model", MODEL)
    assert result.exit_code != 0 and "not UTF-8" in result.output and "Traceback" not in result.output


def test_a_glossary_row_times_tk_with_the_glossary_against_without_it(cli, tmp_path):
    """`--glossary FILE` adds, after each file row, tk's API with the glossary against without it on the same lines."""
    from toolkit.bench.text import _Pair
    from toolkit.core import glossary
    from toolkit.deploy.api import Translator

    pair = _Pair.__new__(_Pair)
    pair.tk, pair.variant = Translator(MODEL, provider="cpu", threads=1), "fp32"
    terms = glossary.from_mapping({"house": "demeure"})
    sources = ["The house is big.", "Where is the station?"]
    said: list[str] = []
    row = pair.glossary_row(sources, ["La maison est grande.", "Où est la gare ?"], 1, 1, terms, said.append)
    assert row.row == "file, greedy, glossary" and [e.name for e in row.engines] == ["tk", "tk, no glossary"]
    assert row.engines[1].same == 0.5  # the line holding the term changed, the other did not
    assert "1 of 2 lines hold one" in said[0]
    path = tmp_path / "terms.tsv"
    path.write_text("house\tdemeure\n", encoding="utf-8")
    assert "add --text FILE" in cli("bench", "--glossary", path).output
