"""Issue 13: bad input is one line and the right exit code, no file is destroyed, no tampered weight passes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_line_error

from toolkit.core import architectures, manifest
from toolkit.core.errors import UsageError
from toolkit.pytorch import checkpoint, registry

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported"


# ---- kind 1: one-line errors, numeric ranges, output paths checked first ------------------------

@pytest.mark.parametrize("args", [
    ["translate", "--max-len", "-1", "Go."],
    ["translate", "--max-tokens", "0", "Go."],
    ["translate", "--alpha", "nan", "Go."],
    ["translate", "--alpha", "inf", "Go."],
    ["translate", "--beam", "5000", "Go."],
    ["translate", "--beam", "0", "Go."],
    ["translate", "--threads", "100000", "Go."],
    ["translate", "--batch-size", "0", "Go."],
    ["translate", "--n-best", "3", "Go."],
    ["evaluate", "MODEL", "--limit", "0"],
    ["evaluate", "MODEL", "--beam", "0"],
    ["bench", "--sentences", "-5"],
    ["bench", "--batch-size", "0"],
    ["verify", "MODEL", "--seed", "-1"],
    ["verify", "MODEL", "--atol", "nan"],
    ["verify", "MODEL", "--sentences", "-1"],
    ["train", "nw", "--epochs", "0"],
    ["train", "nw", "--lr", "-1"],
    ["export", "nw", "--random-init", "--out", "X", "--opset", "5"],
])
@pytest.mark.slow
def test_every_numeric_option_has_a_declared_range(cli, tiny_export, tmp_path, args):
    args = [str(tiny_export) if a == "MODEL" else str(tmp_path / "x") if a == "X" else a for a in args]
    if args[0] == "translate":
        args += ["--model", str(tiny_export)]
    if args[0] == "bench":
        args += ["--model", str(tiny_export)]
    one_line_error(cli(*args), 2)


def test_output_paths_are_checked_before_any_work(cli, tiny_export, tmp_path):
    assert "is a directory" in one_line_error(cli("translate", "Go.", "--model", tiny_export, "-o", tmp_path), 2)
    assert "does not exist" in one_line_error(cli("translate", "Go.", "--model", tiny_export, "-o", tmp_path / "no" / "x"), 2)
    # Before the run: verify never starts, so there is no verdict line.
    result = cli("verify", tiny_export, "--json", tmp_path / "no" / "report.json")
    assert "does not exist" in one_line_error(result, 2) and "checks passed" not in result.output
    assert "is a directory" in one_line_error(cli("verify", tiny_export, "--json", tmp_path), 2)


def test_a_full_disk_is_one_line(cli, tiny_export):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    # The machine's failure, not the user's: exit 1, as from every command (docs/commands.md, errors.os_error_exit_code)
    line = one_line_error(cli("translate", "Go.", "--model", tiny_export, "-q", "-o", "/dev/full"), 1)
    assert "the disk is full" in line and "free space" in line  # named by its cause (errno ENOSPC)


def test_a_non_utf8_reference_fails_before_translating(cli, tiny_export, tmp_path):
    ref = tmp_path / "ref.txt"
    ref.write_bytes(b"Va !\n\xff\xfe\n")
    result = cli("translate", "Go.", "I lost.", "--model", tiny_export, "--reference", ref)
    assert "line 2 is not valid UTF-8" in one_line_error(result, 2)
    assert "sentences/s" not in result.output  # nothing was translated


def _copy(tiny_export, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny_export, out)
    return out


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps(edit(data)))


def _decoder_dims(d: dict, side: str, tensor: int, axis: int, value) -> dict:
    d = json.loads(json.dumps(d))
    d["graphs"]["decoder"]["spec"][side][tensor]["dims"][axis] = value
    return d


def _decoding(d: dict, **rules) -> dict:
    return {**d, "declaration": {**d["declaration"], "decoding": {**d["declaration"]["decoding"], **rules}}}


@pytest.mark.parametrize("edit, expected", [
    (lambda d: [d], "not an object"),
    (lambda d: "x", "not an object"),
    (lambda d: {k: v for k, v in d.items() if k != "graphs"}, "'graphs' is missing"),
    (lambda d: {**d, "config": [1]}, "'config' must be"),
    (lambda d: {**d, "model": "gpt"}, "unknown model type 'gpt'"),
    (lambda d: {**d, "model": "seq2seq"}, "not a 'seq2seq' model's"),
    (lambda d: {**d, "model": "nw"}, "is a module model"),
    (lambda d: {**d, "graphs": {**d["graphs"], "encoder": {**d["graphs"]["encoder"], "file": "../../etc/passwd"}}}, "inside the model directory"),
    (lambda d: {**d, "graphs": {**d["graphs"], "decoder": 3}}, "graphs.decoder is not an object"),
    (lambda d: {**d, "config": {**d["config"], "max_len": "64"}}, "max_len"),
    # A target token the decoder does not score (once found: an IndexError in the decoding loop).
    (lambda d: _decoding(d, forced_first=d["config"]["vocab_size"]), "declaration.decoding.forced_first is 600, not a token"),
    (lambda d: _decoding(d, end=d["config"]["vocab_size"] + 5), "declaration.decoding.end is 605, not a token"),
    (lambda d: _decoding(d, start=10**6), "declaration.decoding.start is 1000000, not a token"),
    # Declared shapes the decoding loop reads (once found: a ValueError and a TypeError).
    (lambda d: _decoder_dims(d, "outputs", 0, 1, 0), "log_probs output is declared ['batch', 0], its last axis not a number"),
    (lambda d: _decoder_dims(d, "inputs", 1, 1, ""), "graphs.decoder.spec.inputs has a malformed tensor"),  # once: a KeyError
])
def test_manifest_is_validated_against_its_schema_when_read(cli, tiny_export, tmp_path, edit, expected):
    model = _copy(tiny_export, tmp_path)
    _edit_manifest(model, edit)
    for args in (["translate", "Go.", "--model", model], ["verify", model, "--sentences", "1"]):
        line = one_line_error(cli(*args), 2)
        assert expected in line and "manifest.json" in line, line


def test_a_decoder_input_without_its_batch_axis_or_weights_unlike_the_config_are_one_line(cli, tiny_export, tmp_path):
    """Once found by generated corruptions: a ValueError in the decoding loop's setup, ONNX Runtime's refusal of a cache
    of 0 heads, a RuntimeError in verify's rebuild of the model. (verify's own interface check fails the first one as
    a row.)"""
    model = _copy(tiny_export, tmp_path)
    _edit_manifest(model, lambda d: _decoder_dims(d, "inputs", 1, 0, 0))
    assert "self_k_0 as [0, 4, 'past_len', 16], without its 'batch' axis" in one_line_error(cli("translate", "Go.", "--model", model), 2)
    _edit_manifest(model, lambda d: _decoder_dims(_decoder_dims(d, "inputs", 1, 0, "batch"), "inputs", 1, 1, 0))  # 0 heads
    line = one_line_error(cli("translate", "Go.", "--model", model), 2)
    assert "input self_k_0 has the shape [batch, 4, past_len, 16], manifest.json declares [batch, 0, past_len, 16]" in line, line
    _edit_manifest(model, lambda d: _decoder_dims(d, "inputs", 1, 1, "heads"))  # a name tk has no size for
    assert "declares an axis 'heads' that is none of the model's" in one_line_error(cli("translate", "Go.", "--model", model), 2)
    other = _copy(tiny_export, tmp_path / "other")
    _edit_manifest(other, lambda d: {**d, "config": {k: v for k, v in d["config"].items() if k != "vocab_size"}})
    line = one_line_error(cli("verify", other, "--sentences", "1"), 2)
    assert "do not fit the model its manifest.json's config describes (size mismatch for" in line, line


def test_the_shipped_manifests_load_and_the_schema_knows_every_registered_model():
    for name in ("transformer", "seq2seq", "nw"):
        m = manifest.load(SHIPPED / name)
        assert manifest.schema_problem(m.to_dict()) is None
    entries = registry.entries()
    assert set(architectures.ARCHITECTURES) == {entry.name for entry in entries}
    for entry in entries:
        assert architectures.get(entry.name).kind == entry.kind


@pytest.mark.parametrize("setting, expected", [
    ("num_layers=abc", "expected an integer"),
    ("num_heads=3", "must divide num_hiddens"),
    ("num_layers=0", "at least 1"),
    ("dropout=1.5", "dropout"),
    ("pre_ln=maybe", "true or false"),
    ("no_such_key=1", "known: "),
    ("embed_size=64", "known: "),  # a seq2seq field, not a transformer one
    ("epochs=0", "epochs must be positive"),
    ("lr=nan", "finite"),
    ("num_layers", "KEY=VALUE"),
])
def test_config_overrides_are_validated_before_any_work(cli, tmp_path, setting, expected):
    out = tmp_path / "run"
    line = one_line_error(cli("train", "transformer", "--preset", "tiny", "--out", out, "--set", setting), 2)
    assert expected in line, line
    assert not out.exists()  # refused before the run directory (or the corpus, or a tokenizer) was touched


def test_valid_overrides_are_parsed_per_field():
    entry = registry.get("transformer")
    parsed = entry.parse_overrides({"pre_ln": "true", "dropout": "0.2", "num_layers": "2", "lr": "1e-3", "max_tokens": 3000},
                                   {"lr": float, "max_tokens": int})
    assert parsed == {"pre_ln": True, "dropout": 0.2, "num_layers": 2, "lr": 1e-3, "max_tokens": 3000}


def test_a_checkpoint_whose_model_type_or_config_was_changed_is_one_line(cli, tiny_checkpoint, tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=False)
    cases = {
        "type": {**ckpt, "model": "seq2seq"},
        "config": {**ckpt, "config": {**ckpt["config"], "num_hiddens": 32}},
        "heads": {**ckpt, "config": {**ckpt["config"], "num_heads": 3}},
        "unknown": {**ckpt, "config": {**ckpt["config"], "colour": "red"}},
        "nonsense": {**ckpt, "config": {**ckpt["config"], "num_layers": "two"}},
    }
    for name, payload in cases.items():
        path = tmp_path / f"{name}.pt"
        torch.save(payload, path)  # the digest is of the tensors, which are unchanged: the config check must catch it
        assert not (tmp_path / f"out-{name}").exists()
        one_line_error(cli("export", path, "--out", tmp_path / f"out-{name}"), 2)
        assert not (tmp_path / f"out-{name}").exists()


# ---- kind 2: nothing destroyed or replaced --------------------------------------------------------

def test_force_replaces_only_a_tk_model_directory(cli, tmp_path):
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "cat.jpg").write_bytes(b"not a model")
    line = one_line_error(cli("export", "dot_attention", "--random-init", "--out", precious, "--force"), 2)
    assert "not an exported tk model directory" in line
    assert (precious / "cat.jpg").read_bytes() == b"not a model"
    # A tk model directory is replaced, as --force promises.
    model = tmp_path / "model"
    assert cli("export", "dot_attention", "--random-init", "--out", model).exit_code == 0
    result = cli("export", "dot_attention", "--random-init", "--out", model, "--force", "--seed", "1")
    assert result.exit_code == 0, result.output
    assert manifest.load(model).to_dict()["checkpoint"]["seed"] == 1


def test_an_export_that_finds_its_output_written_meanwhile_refuses_to_replace_it(cli, tmp_path, monkeypatch):
    """Two exports to one --out: the one that commits second must not silently remove the first one's directory."""
    from toolkit.pytorch import export as export_mod

    out = tmp_path / "model"
    original = export_mod.write_directory
    others = []

    def slow_export(*args, **kwargs):
        data = original(*args, **kwargs)
        if not others:
            others.append("started")  # the other export runs this same function: only the first one waits
            # Meanwhile, another `tk export` finishes first and commits `out`.
            other = cli_other("export", "dot_attention", "--random-init", "--out", out, "--seed", "7")
            assert other.exit_code == 0, other.output
        return data

    from click.testing import CliRunner

    from toolkit.cli import main
    cli_other = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    monkeypatch.setattr(export_mod, "write_directory", slow_export)
    result = cli("export", "dot_attention", "--random-init", "--out", out)
    monkeypatch.undo()
    assert "already exists" in one_line_error(result, 2)
    assert manifest.load(out).to_dict()["checkpoint"]["seed"] == 7  # the other export's directory, intact
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # and no temporary directory left behind


def test_output_through_a_symlink_keeps_the_link_and_an_existing_file_keeps_its_mode(cli, tiny_export, tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old\n")
    os.chmod(target, 0o644)
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert cli("translate", "Go.", "--model", tiny_export, "-q", "-o", link).exit_code == 0
    assert link.is_symlink() and target.read_text().count("\n") == 1 and target.read_text() != "old\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    fresh = tmp_path / "new.txt"
    old_mask = os.umask(0o022)
    try:
        assert cli("translate", "Go.", "--model", tiny_export, "-q", "-o", fresh).exit_code == 0
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # 0666 less the umask, not mkstemp's 0600


def test_output_to_a_fifo_writes_into_it_instead_of_replacing_it(cli, tiny_export, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    result = cli("translate", "Go.", "I lost.", "--model", tiny_export, "-q", "-o", fifo)
    got = reader.communicate(timeout=60)[0]
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got.count(b"\n") == 2


def test_ctrl_c_exits_130_and_leaves_the_old_output_and_no_temporary_file(cli, tiny_export, tmp_path, monkeypatch):
    from toolkit.deploy import translate as translate_mod

    out = tmp_path / "out.txt"
    out.write_text("previous run\n")
    original = translate_mod.translate_lines

    def interrupted(t, lines, write, *args, **kwargs):
        write("half a result")
        raise KeyboardInterrupt

    monkeypatch.setattr(translate_mod, "translate_lines", interrupted)
    result = cli("translate", "Go.", "--model", tiny_export, "-q", "-o", out)
    monkeypatch.setattr(translate_mod, "translate_lines", original)
    assert "interrupted" in one_line_error(result, 130)
    assert out.read_text() == "previous run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def _default_sigint() -> None:
    # A shell starts background jobs (`.ci/run &`, nohup) with SIGINT ignored, and Python installs no
    # KeyboardInterrupt handler in a process that starts that way: give the child what a terminal gives it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_real_translation_exits_130_without_a_temporary_file(tiny_export, tmp_path, sig):
    src = tmp_path / "in.txt"
    src.write_text("The cat is sleeping on the sofa while we wait.\n" * 20000)
    out = tmp_path / "out.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "translate", "-i", str(src), "-o", str(out), "-q",
                             "--model", str(tiny_export), "--threads", "1"], env=env, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    deadline = time.time() + 120
    while not any(p.name.startswith(".out.txt.") for p in tmp_path.iterdir()):  # translation has started
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
        time.sleep(0.05)
    proc.send_signal(sig)
    stderr = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "error: interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_dash_means_standard_input(tiny_export, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run([sys.executable, "-m", "toolkit.cli", "translate", "-i", "-", "-o", "-", "-q", "--model", str(tiny_export)],
                         input=b"Go.\n\nI lost.\n", capture_output=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count(b"\n") == 3


# ---- kind 3: the chain of custody of the weights ---------------------------------------------

def test_a_checkpoint_with_a_modified_tensor_is_refused(cli, tiny_checkpoint, tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=False)
    assert ckpt["weights_sha256"] == checkpoint.state_dict_sha256(ckpt["state_dict"])
    name = next(k for k, v in ckpt["state_dict"].items() if v.dtype == torch.float32 and v.numel() > 100)
    ckpt["state_dict"][name].view(-1)[7] += 1.0
    bad = tmp_path / "bad.pt"
    torch.save(ckpt, bad)
    with pytest.raises(UsageError, match="fails its weights digest"):
        checkpoint.load(bad)
    one_line_error(cli("export", bad, "--out", tmp_path / "out"), 2)
    assert not (tmp_path / "out").exists()


def test_a_flipped_byte_in_a_checkpoint_file_is_refused(cli, tiny_checkpoint, tmp_path):
    """A raw flip inside a stored tensor: torch loads it without complaint, the digest does not."""
    raw = bytearray(tiny_checkpoint.read_bytes())
    ckpt = torch.load(tiny_checkpoint, weights_only=False)
    name = next(k for k, v in ckpt["state_dict"].items() if v.dtype == torch.float32 and v.numel() > 1000)
    needle = ckpt["state_dict"][name].contiguous().numpy().tobytes()[:64]
    at = bytes(raw).index(needle) + 2
    raw[at] ^= 0x10
    bad = tmp_path / "flipped.pt"
    bad.write_bytes(bytes(raw))
    line = one_line_error(cli("export", bad, "--out", tmp_path / "out"), 2)
    assert "corrupt" in line or "digest" in line


def test_a_checkpoint_without_a_digest_loads_with_a_warning(tiny_checkpoint, tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=False)
    del ckpt["weights_sha256"]
    old = tmp_path / "old.pt"
    torch.save(ckpt, old)
    warnings = []
    assert checkpoint.load(old, warn=warnings.append)["model"] == "transformer"
    assert len(warnings) == 1 and "no weights digest" in warnings[0]


def _tamper(directory: Path) -> None:
    """Changes one encoder weight a lot and rewrites every digest in the manifest to match, as an attacker would."""
    import onnx

    graph = onnx.load(directory / "encoder.onnx", load_external_data=False).graph
    init = next(i for i in graph.initializer if i.external_data and i.name.startswith("model.encoder_blocks"))
    offset = int({e.key: e.value for e in init.external_data}["offset"])
    blob = bytearray((directory / "weights.bin").read_bytes())
    blob[offset: offset + 4] = np.float32(101.5).tobytes()
    (directory / "weights.bin").write_bytes(bytes(blob))
    d = json.loads((directory / "manifest.json").read_text())
    for g in d["graphs"].values():
        g["sha256"] = manifest.file_sha256(directory / g["file"])
        g["weights"]["sha256"] = manifest.file_sha256(directory / "weights.bin")
    from toolkit.pytorch.reference import weights_from_graphs

    m = manifest.Manifest.from_dict(directory, d)
    entry = registry.get(d["model"])
    d["checkpoint"] = {"path": str(directory / "gone.pt"), "sha256": "0" * 64,
                       "weights_sha256": checkpoint.weights_sha256(weights_from_graphs(m, entry, entry.config(**d["config"])))}
    (directory / "manifest.json").write_text(json.dumps(d))


@pytest.mark.slow
def test_tampered_weights_with_rewritten_digests_say_what_verify_proved_and_fail_given_the_checkpoint(
        cli, tiny_export, tiny_checkpoint, tmp_path):
    model = _copy(tiny_export, tmp_path)
    good_digest = manifest.load(model).to_dict()["checkpoint"]["weights_sha256"]
    _tamper(model)
    report = tmp_path / "r.json"
    # Without an outside reference, verify can only prove graph-vs-graph parity, and says exactly that.
    result = cli("verify", model, "--sentences", "2", "--json", report)
    assert result.exit_code == 0, result.output
    assert "parity of the computation only, not of the weights" in result.output
    data = json.loads(report.read_text())
    assert data["reference_kind"] == "graphs" and "not of the weights" in data["reference_proves"]
    assert data["graph_weights_sha256"] != good_digest
    # Given the checkpoint, or the digest it carries, the tampering fails (exit 1), named in the report.
    for extra in (["--checkpoint", tiny_checkpoint], ["--expect-digest", good_digest]):
        result = cli("verify", model, "--sentences", "2", "--json", report, *extra)
        assert result.exit_code == 1, result.output
        failures = json.loads(report.read_text())["failures"]
        assert any(f["check"] == "weights" for f in failures), failures
    # The untampered export passes with the same options.
    result = cli("verify", tiny_export, "--sentences", "2", "--json", report, "--expect-digest", good_digest, "--checkpoint", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["reference_kind"] == "checkpoint"


def test_export_records_the_digest_the_checkpoint_carried(tiny_export, tiny_checkpoint):
    record = manifest.load(tiny_export).to_dict()["checkpoint"]
    carried = torch.load(tiny_checkpoint, weights_only=False)["weights_sha256"]
    assert record["checkpoint_weights_sha256"] == carried == record["weights_sha256"]


def test_one_line_errors_keep_tks_own_fix_and_cut_only_foreign_messages():
    from toolkit.core.errors import ProviderError, first_line
    from toolkit.runtimes.onnxruntime.cuda import CUDA_FIX

    assert first_line(ProviderError(CUDA_FIX)) == CUDA_FIX  # the fix ("or use --provider cpu") is at the end
    assert first_line(RuntimeError("x" * 500 + "\nsecond line")) == "x" * 200
    assert first_line(RuntimeError("")) == "RuntimeError"


@pytest.mark.slow
def test_commands_that_translate_refuse_a_directory_that_cannot_in_one_line(cli, random_export, tmp_path):
    """One check owns this (Manifest.translation_tokenizer): tk translate, export --web and translate-corpus."""
    lines = tmp_path / "in.txt"
    lines.write_text("Go.\n")
    no_tokenizer = random_export("transformer")
    for model, says in ((SHIPPED / "nw", "not a translation model"), (no_tokenizer, "has no tokenizer")):
        for args in (("translate", "--model", model, "Go."), ("export", model, "--web", tmp_path / "site"),
                     ("translate-corpus", model, lines, tmp_path / "out")):
            r = cli(*args)
            assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)
    assert not (tmp_path / "site").exists() and not (tmp_path / "out").exists()


def test_a_signal_as_the_output_is_opened_leaves_no_temporary_file(cli, tiny_export, tmp_path, monkeypatch):
    """Python delivers a signal as a call returns: as os.open returns the new temporary file, before any code holds it to
    remove it. (CI once caught a SIGINT there: exit 130, and `.out.txt.<pid>-<hex>.tmp` left beside the output.)"""
    from toolkit.core import atomic

    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("Go.\n")
    out.write_text("previous results\n")
    real = os.open

    def interrupted_as_it_returns(path, *args, **kwargs):
        fd = real(path, *args, **kwargs)
        if Path(path).name.startswith(".out.txt."):
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(atomic.os, "open", interrupted_as_it_returns)
    result = cli("translate", "--model", tiny_export, "-i", src, "-o", out, "-q")
    assert result.exit_code == 130, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    assert out.read_text() == "previous results\n"
