"""A checkpoint is a file from outside: no command may run code stored in it (issue 36, class 1).

The payload is a pickle whose unpickling runs a shell command that creates a marker file. A digest
written beside it (in a manifest) proves nothing, since whoever wrote the payload wrote the digest.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from toolkit.core.errors import UsageError
from toolkit.core.manifest import file_sha256
from toolkit.pytorch import checkpoint


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_checkpoint(path: Path, marker: Path, model: str = "transformer") -> Path:
    torch.save({"format": checkpoint.FORMAT, "model": model, "config": {}, "state_dict": {}, "hook": _Payload(marker)}, path)
    return path


def _refused_in_one_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def test_loading_a_pickle_payload_runs_nothing_and_names_what_it_refused(tmp_path):
    marker = tmp_path / "ran"
    evil = _evil_checkpoint(tmp_path / "evil.pt", marker)
    # Guard against a test that passes because the payload never worked: a full unpickle does run it.
    torch.load(evil, weights_only=False)
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UsageError, match="other than tensors and plain values.*never unpickles"):
        checkpoint.load(evil)
    assert not marker.exists()


def test_no_command_runs_a_checkpoint_payload(cli, tiny_export, tmp_path):
    marker = tmp_path / "ran"
    evil = _evil_checkpoint(tmp_path / "evil.pt", marker)
    # A model directory whose manifest names the payload as its checkpoint, with the payload's own sha256.
    model = tmp_path / "model"
    shutil.copytree(tiny_export, model)
    data = json.loads((model / "manifest.json").read_text())
    data["checkpoint"].update(path=str(evil), sha256=file_sha256(evil), random_init=False)
    (model / "manifest.json").write_text(json.dumps(data))
    resumed = tmp_path / "run"
    resumed.mkdir()
    _evil_checkpoint(resumed / "checkpoint.pt", marker)

    for args in (("export", evil, "--out", tmp_path / "out"),
                 ("verify", model, "--sentences", "1"),
                 ("verify", tiny_export, "--checkpoint", evil, "--sentences", "1"),
                 ("translate", "--backend", "torch", "--model", model, "Go."),
                 ("bench", "--model", model, "--sentences", "1", "--batch-size", "1"),
                 ("train", "transformer", "--preset", "tiny", "--out", resumed, "--resume")):
        result = cli(*args)
        assert not marker.exists(), f"tk {' '.join(map(str, args))} ran the checkpoint's code"
        line = _refused_in_one_line(result)
        assert "never unpickles" in line, (args, line)
    assert not (tmp_path / "out").exists()


def test_training_the_kernel_regression_again_never_replaces_its_checkpoint(cli, tmp_path):
    run = tmp_path / "run"
    assert cli("train", "nw", "--out", run, "--epochs", "1").exit_code == 0
    before = (run / "checkpoint.pt").read_bytes()
    for extra in ((), ("--resume",)):
        line = _refused_in_one_line(cli("train", "nw", "--out", run, "--epochs", "1", *extra))
        assert ("already exists" in line) if not extra else ("without --resume" in line), line
    assert (run / "checkpoint.pt").read_bytes() == before
