"""`tk bench --text FILE`: tk's API with its defaults against CTranslate2, text in and text out, from one command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.bench.text import TextRow, read_text, table
from toolkit.core.errors import DataError, UsageError

ROOT = Path(__file__).resolve().parents[1]
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


def test_the_table_says_which_side_is_faster_and_by_how_much():
    rows = [TextRow("file, greedy", "fp32", 2.0, 3.0, (1, 2), 2000, 43.8, 43.3),
            TextRow("requests, greedy", "int8", 0.006, 0.003, (1, 1), 200)]
    lines = table(rows).splitlines()
    assert "1,000 sent/s" in lines[1] and "667 sent/s" in lines[1] and "1.50x" in lines[1] and "43.8" in lines[1]
    assert "6.0 ms" in lines[2] and "3.0 ms" in lines[2] and "0.50x" in lines[2]


@pytest.mark.timeout(600)
def test_one_command_compares_every_row_without_torch(tmp_path):
    """The whole comparison runs from one command, torch-free like the deploy path, and writes every row
    with both sides' times, CTranslate2's threads, and BLEU beside the file rows."""
    out = tmp_path / "rows.json"
    code = ("import sys\nfrom toolkit.cli import main\n"
            f"sys.argv = ['tk', 'bench', '--model', {str(MODEL)!r}, '--text', {str(challenge_file(tmp_path / 't.txt'))!r},"
            f" '--requests', '2', '--repeat', '1', '--variant', 'fp32', '--beam', '1', '--json', {str(out)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tk defaults here:" in proc.stderr and "CTranslate2 float32 fastest here" in proc.stderr
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == ["file, greedy", "requests, greedy", "cold start"]
    for r in rows:
        assert r["tk_s"] > 0 and r["ct2_s"] > 0 and r["tk_speedup"] == pytest.approx(r["ct2_s"] / r["tk_s"])
        assert len(r["ct2_threads"]) == 2
    assert rows[0]["sentences"] == len(CHALLENGE) and 0 <= rows[0]["tk_bleu"] <= 100 and 0 <= rows[0]["ct2_bleu"] <= 100
    assert "file, greedy" in proc.stdout and "cold start" in proc.stdout


def test_a_bad_text_file_is_one_line_and_exit_2(cli, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    result = cli("bench", "--text", tmp_path / "bad.txt", "--model", MODEL)
    assert result.exit_code != 0 and "not UTF-8" in result.output and "Traceback" not in result.output
