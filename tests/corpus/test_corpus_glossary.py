"""tk translate-corpus --glossary: every actor gets the glossary's terms, the lines come out as `tk translate --glossary`
writes them, and the run records the glossary (a rerun with another one is refused rather than mixing two). The
shipped Transformer writes "maison" for "house" on its own. On a local Ray instance."""

from __future__ import annotations

import json

import pytest
from conftest import REPO
from helpers import one_line_error

from toolkit.core import glossary

pytestmark = pytest.mark.slow  # Ray's start takes seconds

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")

SHIPPED = REPO / "exported" / "transformer"
LINES = ["The house is big.", "Where is the station?", "", "This house is bigger than that house.", "I'm home."]


def test_a_corpus_with_a_glossary_gives_tk_translates_lines_and_records_the_glossary(cli, ray_address, tmp_path):
    src, terms, other = tmp_path / "in.txt", tmp_path / "terms.tsv", tmp_path / "other.tsv"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    terms.write_text("house\tdemeure\n", encoding="utf-8")
    other.write_text("house\tlogis\n", encoding="utf-8")
    out = tmp_path / "out"
    result = cli("translate-corpus", SHIPPED, src, out, "--shard-lines", 2, "--glossary", terms)
    assert result.exit_code == 0, result.output
    got = (out / "translations.txt").read_text(encoding="utf-8").splitlines()
    plain = cli("translate", "--model", SHIPPED, "-q", "--glossary", terms, "-i", src)
    assert got == plain.output.splitlines()
    assert [glossary.count(line, "demeure") for line in got] == [1, 0, 0, 2, 0]
    settings = json.loads((out / "corpus.json").read_text())["settings"]
    assert settings["glossary_sha256"] == glossary.load(terms).digest
    assert "glossary_sha256" in one_line_error(cli("translate-corpus", SHIPPED, src, out, "--glossary", other, "--shard-lines", 2), 2)
    assert "line 1 has no TAB" in one_line_error(cli("translate-corpus", SHIPPED, src, tmp_path / "o2", "--glossary", src), 2)
