"""Helpers several test modules share (not tests themselves)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from toolkit.core.decoding import StepBackend
from toolkit.core.digests import file_sha256
from toolkit.core.tokenizer import EOS


def rehash(directory: Path) -> None:
    """Re-record the sha256 of every graph (stored variants' too) and weights file in the manifest, so that only the numbers
    can reveal a change (a fault planted in a graph is then what the user exported)."""
    path = directory / "manifest.json"
    d = json.loads(path.read_text())
    for g in d["graphs"].values():
        g["sha256"] = file_sha256(directory / g["file"])
        if "weights" in g:
            g["weights"]["sha256"] = file_sha256(directory / g["weights"]["file"])
    for stored in (d.get("variants") or {}).values():
        for g in stored["graphs"].values():
            g["sha256"] = file_sha256(directory / g["file"])
            g["bytes"] = (directory / g["file"]).stat().st_size
    path.write_text(json.dumps(d))


def one_line_error(result, code: int) -> str:
    """The click result failed with `code` and said so in one `error:` line, with no traceback."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


class Scripted(StepBackend):
    """Writes the same tokens for every sentence, then stops: a model that does exactly what a test says."""

    def __init__(self, tokens: list[int], vocab: int):
        self.tokens, self.vocab = tokens, vocab

    def encode(self, src, src_len):
        return {"rows": np.arange(len(src)), "t": 0}

    def step(self, token, state):
        logp = np.full((len(state["rows"]), self.vocab), -20.0, dtype=np.float32)
        t = state["t"]
        logp[:, self.tokens[t] if t < len(self.tokens) else EOS] = -0.01
        return logp, {**state, "t": t + 1}

    def select(self, state, rows):
        return {**state, "rows": state["rows"][rows]}


def check_int8_and_openvino(cli, hf: Path, out: Path, english: list[str], tmp_path: Path) -> None:
    """An imported model's guarded int8 stored beside its graphs and verified against `hf:` (held to int8's
    tolerances), and OpenVINO giving ONNX Runtime's text with the en -> fr pair chosen: the paths docs/models.md marks
    measured for each architecture tk imports."""
    import shutil

    directory = tmp_path / "variants"
    shutil.copytree(out, directory)
    result = cli("export", directory, "--quantize", "int8")
    assert result.exit_code == 0, result.output
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--variant", "int8", "--sentences", 8)
    assert result.exit_code == 0, result.output
    args = ("translate", "--model", directory, "--variant", "fp32", "--source-lang", "en", "--target-lang", "fr", "--raw", *english)
    openvino, onnxruntime = cli(*args, "--runtime", "openvino"), cli(*args)
    assert openvino.exit_code == 0 and onnxruntime.exit_code == 0, openvino.output + onnxruntime.output
    lines = [line for line in openvino.stdout.splitlines() if line]
    assert lines == [line for line in onnxruntime.stdout.splitlines() if line] and len(lines) == len(english)


def check_ctranslate2(cli, hf: Path, out: Path, english: list[str], want: list[str], tmp_path: Path, fault: tuple[str, str],
                      **languages: str) -> None:
    """An import's CTranslate2 conversion (`tk export DIR --ctranslate2`) verified against `hf:` (scores and greedy
    tokens), translating to generate's greedy text (`want`) through the Python API, and a planted converter fault (the
    two named weights swapped) failing verify's score rows."""
    import shutil

    from toolkit import Translator
    from toolkit.runtimes.ctranslate2 import spec

    directory = tmp_path / "ct2"
    shutil.copytree(out, directory)
    result = cli("export", directory, "--ctranslate2")
    assert result.exit_code == 0, result.output
    result = cli("verify", directory, "--runtime", "ctranslate2", "--checkpoint", f"hf:{hf}", "--sentences", 8)
    assert result.exit_code == 0, result.output
    assert "score " in result.output and "8/8 identical to the ONNX graphs'" in result.output
    got = Translator(directory, runtime="ctranslate2").translate(english, raw=True, loop_guard=False, max_len_a=None, **languages)
    assert sum(a != b for a, b in zip(got, want)) <= 1 and len(set(want)) > 5  # one near-tie, at most

    real, (a, b) = spec.graph_weights, fault

    def swapped(m):
        w = real(m)
        w[a], w[b] = w[b], w[a]
        return w

    spec.graph_weights = swapped
    try:
        store_unchecked_ct2(directory)
    finally:
        spec.graph_weights = real
    result = cli("verify", directory, "--runtime", "ctranslate2", "--checkpoint", f"hf:{hf}", "--sentences", 0)
    assert result.exit_code == 1, result.output
    assert [line.split()[-1] for line in result.output.splitlines() if line.startswith("score")] == ["FAIL"]


def store_unchecked_ct2(directory: Path) -> None:
    """`tk export DIR --ctranslate2 --force` without the write's own check (which refuses a converter fault): how a fault
    planted in the conversion reaches the directory, for `tk verify --runtime ctranslate2` to find."""
    from dataclasses import replace

    from toolkit.convert import convert, ctranslate2

    convert(replace(ctranslate2.WRITER, verify=lambda m, tmp, written: None), directory, force=True)
