"""The one converter pipeline (toolkit.convert, issue 47): files stored inside a model directory (--ctranslate2, the
variants) land through one step whose commit is the manifest, so a --force rebuild that fails before the manifest is
rewritten leaves the directory as it was: the files it lists, with their digests, and no temporary directory; and the
export command offers exactly the registry's writers."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from toolkit.core import manifest

REPO = Path(__file__).resolve().parents[2]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


@pytest.mark.parametrize("args, model", [(("--optimize",), "nw"), (("--ctranslate2",), "transformer")])
def test_a_rebuild_that_fails_before_the_manifest_is_written_leaves_the_old_files(cli, tmp_path, monkeypatch, args, model):
    directory = tmp_path / "M"
    shutil.copytree(REPO / "exported" / model, directory)
    first = cli("export", directory, *args)
    assert first.exit_code == 0, first.output
    before = _snapshot(directory)

    def full_disk(self):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.directory / "manifest.json"))

    monkeypatch.setattr(manifest.Manifest, "save", full_disk)
    failed = cli("export", directory, *args, "--force")
    assert failed.exit_code != 0 and "Traceback" not in failed.output and "the disk is full" in failed.output, failed.output
    monkeypatch.undo()
    assert _snapshot(directory) == before  # the old graphs or conversion, byte for byte, and nothing new beside them
    manifest.load(directory).check_files()  # every file the manifest lists, with its digest
    assert not [p.name for p in directory.iterdir() if p.is_dir()]  # no temporary directory left


def test_the_export_command_offers_exactly_the_registry_s_writers(cli):
    from toolkit.convert import NewDirectory, registry

    shown = cli("export", "--help").output
    for name, entry in registry.TABLE.items():
        writer = registry.get(name)
        assert writer.name == name and entry.takes_dir == isinstance(writer.lands, NewDirectory)
        assert f"--{name}{' DIR' if entry.takes_dir else ''} " in shown, name
