"""Where the default model lies: the one `tk translate`, `tk serve` and `Translator()` use when none is named.

$TK_MODEL first; else the model installed with tk (the wheel carries exported/transformer as
toolkit/shipped/transformer, see pyproject.toml); else a clone's exported/transformer (an editable
install). The folder is named after the architecture whose entry is shipped as the default. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from toolkit.core.architectures import shipped

_PACKAGE = Path(__file__).resolve().parents[1]  # toolkit/
DEFAULT = shipped("default")[0]
INSTALLED = _PACKAGE / "shipped" / DEFAULT
CLONE = _PACKAGE.parent / "exported" / DEFAULT


def default_model() -> Path:
    if os.environ.get("TK_MODEL"):
        return Path(os.environ["TK_MODEL"])
    return INSTALLED if (INSTALLED / "manifest.json").is_file() else CLONE
