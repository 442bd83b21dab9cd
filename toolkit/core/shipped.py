"""Where the default model lies: the one `tk translate`, `tk serve` and `Translator()` use when none is named.

$TK_MODEL first; else the model installed with tk (the wheel carries exported/transformer as
toolkit/shipped/transformer, see pyproject.toml); else a clone's exported/transformer (an editable
install). Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # toolkit/
INSTALLED = _PACKAGE / "shipped" / "transformer"
CLONE = _PACKAGE.parent / "exported" / "transformer"


def default_model() -> Path:
    if os.environ.get("TK_MODEL"):
        return Path(os.environ["TK_MODEL"])
    return INSTALLED if (INSTALLED / "manifest.json").is_file() else CLONE
