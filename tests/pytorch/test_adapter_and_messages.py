"""Issue 46: adapters that break the contract, inputs left from the last round, and messages that misled or were
missing. Each is one `error:` line naming the problem and the fix, at the start, never a traceback, never a directory
that fails later."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_error

from toolkit.core import manifest
from toolkit.core.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# ---- adapters -----------------------------------------------------------------------------------------------------

# A model that keeps the contract: the prefix as its state, log-probabilities over the tokenizer's whole vocabulary.
# Each case below changes one thing in it (EDITS), as a user's first attempt would.
TINY = '''
import sys
import torch
from torch import nn
from toolkit import Seq2SeqAdapter

TOKENIZER = {tokenizer!r}
VOCAB = 6000


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)

    def encode(self, src, src_len):
        return {{"memory": self.embed(src)}}

    def decode_step(self, token, state):
        prefix = torch.cat([state["prefix"], token[:, None]], dim=1)
        hidden = self.embed(prefix).mean(1) + state["memory"].mean(1)
        return torch.log_softmax(self.out(hidden), dim=-1), {{**state, "prefix": prefix}}


def build():
    model = Tiny()
    return Seq2SeqAdapter(model=model, tokenizer=TOKENIZER, encoder_outputs={{"memory": ("batch", "src_len", 8)}},
                          decoder_state={{"prefix": ("batch", "past_len")}}, integer=frozenset({{"prefix"}}),
                          vocab_size=VOCAB, max_len=16)
'''

EDITS = {
    "not_a_module": (("class Tiny(nn.Module):", "class Tiny:"), ("        super().__init__()\n", "")),
    "outputs_as_a_list": (('encoder_outputs={"memory": ("batch", "src_len", 8)}', 'encoder_outputs=["memory"]'),),
    "tokenizer_as_bytes": (("tokenizer=TOKENIZER,", "tokenizer=open(TOKENIZER, 'rb').read(),"),),
    "wrong_vocabulary_width": (("self.out = nn.Linear(8, VOCAB)", "self.out = nn.Linear(8, VOCAB - 1000)"),),
    "state_that_does_not_grow": (('{**state, "prefix": prefix}', '{**state, "prefix": state["prefix"]}'),),
    "float64_model": (("    model = Tiny()\n", "    model = Tiny().double()\n"),),
    "exits_with_3": (("    model = Tiny()\n", "    sys.exit(3)\n"),),
    "encode_returns_a_list": (('return {"memory": self.embed(src)}', "return [self.embed(src)]"),),
}
SAYS = {
    "not_a_module": ("the model is a Tiny, not a torch.nn.Module", "subclass torch.nn.Module"),
    "outputs_as_a_list": ("encoder_outputs is a list", "give a dict of tensor name -> dims"),
    "tokenizer_as_bytes": ("tokenizer is a bytes, not the path of a SentencePiece model file", "write the bytes to a file"),
    "wrong_vocabulary_width": ("log_probs of shape (3, 5000)", "vocab_size 6000"),
    "state_that_does_not_grow": ("returned prefix with the shape it was given", "declare a state of fixed shape"),
    "float64_model": ("weights are float64", "model.float()"),
    "exits_with_3": ("build() exited with status 3", "instead of calling sys.exit"),
    "encode_returns_a_list": ("model.encode returned a list, not a dict of tensors", "for every tensor of encoder_outputs"),
}


def _adapter(tmp_path: Path, edits: tuple[tuple[str, str], ...] = ()) -> str:
    text = TINY.format(tokenizer=str(SHIPPED / "transformer" / "tokenizer.model"))
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    module = tmp_path / "mine.py"
    module.write_text(text)
    return f"{module}:build"


@pytest.mark.parametrize("case", list(EDITS))
def test_an_adapter_that_breaks_the_contract_is_refused_in_one_line_before_any_export(cli, tmp_path, case):
    out = tmp_path / "out"
    line = one_line_error(cli("export", _adapter(tmp_path, EDITS[case]), "--out", out), 2)
    for words in SAYS[case]:
        assert words in line, line
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["mine.py"]  # no directory that fails later


def test_the_adapter_the_refusals_start_from_keeps_the_contract(tmp_path):
    """The cases above differ from it by one edit each: the checks themselves accept it."""
    from toolkit.pytorch import adapter

    own, settings = adapter.load(_adapter(tmp_path))
    assert settings.vocab_size == 6000 and [s.name for s in settings.specs()] == ["encoder", "decoder"]


def test_a_fixed_size_state_that_grows_anyway_is_one_line(cli, tmp_path):
    """A state declared without 'past_len' keeps its shape (an RNN's hidden state, accepted since issue 52); one that
    grows all the same breaks the declaration, said with the shapes."""
    target = _adapter(tmp_path, (('decoder_state={"prefix": ("batch", "past_len")}', 'decoder_state={"prefix": ("batch", 8)}'),))
    line = one_line_error(cli("export", target, "--out", tmp_path / "out"), 2)
    assert "returned prefix of shape (3, 9) on an example batch, expected (batch=3, 8)" in line


# ---- left from the last round ------------------------------------------------------------------------------------

def test_a_lone_surrogate_given_to_the_api_is_a_usage_error():
    from toolkit import Translator

    translator = Translator(SHIPPED / "transformer")
    with pytest.raises(UsageError, match=r"texts\[1\] has a lone surrogate \(\\ud800 at 3\)"):
        translator.translate(["Hello.", "Hi \ud800"])


def test_a_sentence_that_is_not_utf8_is_one_line_in_tk_attention(cli, tmp_path):
    out = tmp_path / "a.png"
    line = one_line_error(cli("attention", SHIPPED / "seq2seq", "Go\udcff.", "-o", out), 2)  # $'Go\xff.' as Python gets it
    assert "not valid UTF-8" in line
    assert not out.exists()


def test_an_export_to_a_name_that_is_not_utf8_is_refused_before_any_work(cli, tmp_path):
    out = Path(os.fsdecode(bytes(tmp_path) + b"/nw\xff"))
    line = one_line_error(cli("export", "nw", "--random-init", "--out", out), 2)
    assert "--out" in line and "not a valid UTF-8 path" in line and "choose a UTF-8 name" in line
    assert not any(tmp_path.iterdir())


def _nw_with_points(tmp_path: Path, **arrays) -> Path:
    """exported/nw with its train_points.npz replaced, the digest rewritten as an attacker would."""
    model = tmp_path / "nw"
    shutil.copytree(SHIPPED / "nw", model)
    np.savez(model / "train_points.npz", **arrays)
    data = json.loads((model / "manifest.json").read_text())
    for record in data["extra_files"]:
        if record["file"] == "train_points.npz":
            record["sha256"] = manifest.file_sha256(model / "train_points.npz")
    (model / "manifest.json").write_text(json.dumps(data))
    return model


def test_an_npz_with_an_object_array_is_never_unpickled(cli, tmp_path):
    marker = tmp_path / "unpickled"

    class Planted:  # unpickling it makes the directory `marker`: code run from a file
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    model = _nw_with_points(tmp_path, x=np.array([Planted(), None], dtype=object), y=np.zeros(2, np.float32))
    line = one_line_error(cli("attention", model, "-o", tmp_path / "nw.png"), 2)
    assert "object array" in line and "re-export" in line
    assert not marker.exists() and not (tmp_path / "nw.png").exists()


def test_an_npz_without_the_training_points_is_one_line(cli, tmp_path):
    model = _nw_with_points(tmp_path, keys=np.zeros(3, np.float32))
    assert "not a valid train_points.npz" in one_line_error(cli("attention", model, "-o", tmp_path / "nw.png"), 2)


# ---- messages ----------------------------------------------------------------------------------------------------

def test_ctranslate2_on_a_model_tk_does_not_convert_never_advises_the_conversion(tmp_path):
    """A model CTranslate2 does not run, without a CTranslate2 copy: `--runtime ctranslate2` advised `tk export DIR
    --ctranslate2`, which refuses such a model. Both now say the same: not supported, use ONNX Runtime."""
    from toolkit.runtimes.ctranslate2 import engine, spec

    m = manifest.load(SHIPPED / "transformer")
    m.model = "seq2seq"  # what tk's GRU's manifest says; the message depends on nothing else
    with pytest.raises(UsageError) as runtime_error:
        engine.stored_files(m)
    with pytest.raises(UsageError) as export_error:
        spec.model_spec(m)
    said = str(runtime_error.value)
    assert "--ctranslate2" not in said and "use --runtime onnxruntime" in said and "a 'seq2seq' model" in said
    assert said == str(export_error.value)


@pytest.mark.parametrize(("code", "exit_code"), [(errno.EACCES, 2), (errno.ENOSPC, 1)])
def test_permission_denied_on_an_input_exits_2_as_the_docs_say(cli, tmp_path, monkeypatch, code, exit_code):
    """docs/commands.md: 2 for a usage problem (a file that cannot be read), 1 for a full disk. Files are opened as
    the user cannot read them (tests often run as root, whom permissions do not stop)."""
    source = tmp_path / "in.txt"
    source.write_text("Hello.\n")
    real_open = builtins.open

    def denied(file, *args, **kwargs):
        if str(file) == str(source):
            raise OSError(code, os.strerror(code), str(source))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", denied)
    line = one_line_error(cli("translate", "--model", SHIPPED / "transformer", "-i", source), exit_code)
    assert line.startswith(f"error: {source}: ")


def test_the_api_refuses_a_dict_and_a_set_of_texts():
    from toolkit import Translator

    translator = Translator(SHIPPED / "transformer")
    for texts in ({"Hello.": 1}, {"Hello."}):
        with pytest.raises(UsageError, match=f"translate takes a list of texts \\(str\\), not a {type(texts).__name__}"):
            translator.translate(texts)


@pytest.mark.parametrize("model_dir", [123, b"exported/transformer", ["exported/transformer"]])
def test_a_translator_given_something_other_than_a_path_says_what_it_takes(model_dir):
    from toolkit import Translator

    with pytest.raises(UsageError, match=r"model_dir must be a model directory's path \(a str or pathlib.Path\)"):
        Translator(model_dir)


# A Python that sends itself SIGNAL when `tk` imports MODULE, as a Ctrl-C or a SIGTERM arriving at that moment would.
# With CONVERT the import fails the way a native module's does when a signal interrupts its initialisation
# (onnxruntime's: "ImportError: initialization failed", raised from the KeyboardInterrupt).
INTERRUPTED = '''
import os, signal, sys
MODULE, SIGNAL, CONVERT = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3] == "convert"

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        if not CONVERT:
            os.kill(os.getpid(), SIGNAL)
            return None
        try:
            os.kill(os.getpid(), SIGNAL)
            for _ in range(10 ** 8):  # the handler runs here, between two bytecodes
                pass
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e
        raise AssertionError("the signal was not handled")

sys.meta_path.insert(0, Interrupt())
sys.argv = ["tk", *sys.argv[4:]]
from toolkit.cli import main
main()
'''


def _interrupted(module: str, sig: str, convert: bool = False) -> subprocess.CompletedProcess:
    argv = ["translate", "--model", str(SHIPPED / "transformer"), "Hello."]
    return subprocess.run([sys.executable, "-c", INTERRUPTED, module, sig, "convert" if convert else "plain", *argv], env=ENV,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_tk_starts_exits_130_in_one_line(sig):
    """While `tk` imports its commands (click is imported after the handlers, before every command): Ctrl-C printed a
    KeyboardInterrupt traceback and SIGTERM killed the process (143)."""
    proc = _interrupted("click", sig)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "error: interrupted", proc.stderr


def test_sigterm_that_breaks_a_native_import_while_the_model_loads_exits_130():
    proc = _interrupted("onnxruntime.capi._pybind_state", "SIGTERM", convert=True)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: interrupted" and "internal error" not in proc.stderr, proc.stderr


def test_an_interrupted_load_waits_for_its_loader_threads():
    """A process that exits while a loader thread is still inside ONNX Runtime aborts (exit 134, "terminate called
    without an active exception"): a Ctrl-C while the main thread waits for the loaders is raised only once they are done."""
    from toolkit.runtimes.onnxruntime import loading

    release, finished = threading.Event(), threading.Event()

    def slow():
        release.wait()
        time.sleep(0.05)
        finished.set()

    def ctrl_c_then_release():
        time.sleep(0.2)  # the main thread is waiting for `slow` by now
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        release.set()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c_then_release).start()
        with pytest.raises(KeyboardInterrupt):
            loading._concurrently({"encoder": lambda: None, "decoder": slow})
        assert finished.is_set()
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
