"""The writers `tk export DIR --NAME` offers, registered once: a name, the module whose `WRITER` (a
toolkit.convert.Writer) declares it, and its option's help. A new writer is one module plus one line in TABLE; the
export command makes an option of each line and runs the one asked for through toolkit.convert.convert. Imports no
writer: `get(name)` imports the one module asked for, so `tk export --help` stays light.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from toolkit.convert.pipeline import Writer


@dataclass(frozen=True)
class Entry:
    """A writer's line: the module declaring WRITER; its option's help; whether the option names an output directory
    (`--web DIR`: the writer lands as a NewDirectory) or is a flag (`--ctranslate2`: it stores into the model directory)."""

    module: str
    help: str
    takes_dir: bool


# name -> entry. The name is the option: `tk export DIR --to-hf OUT`; the order is `tk export --help`'s.
TABLE: dict[str, Entry] = {
    "ctranslate2": Entry("toolkit.convert.ctranslate2", takes_dir=False,
                         help="On an exported Transformer: also store its weights converted for CTranslate2, for --runtime ctranslate2 "
                              "(float32; int8 is chosen at load; --force converts again)."),
    "web": Entry("toolkit.convert.web", takes_dir=True,
                 help="On an exported directory: write a static site to DIR that translates in the browser (needs onnxruntime-web: "
                      "`npm ci --prefix toolkit/web` in a clone; an installed tk names its own folder; --force replaces an existing site)."),
    "to-hf": Entry("toolkit.convert.to_hf", takes_dir=True,
                   help="On an exported Transformer: write it as a Hugging Face MarianMTModel directory DIR (safetensors, "
                        "config, generation config, tokenizer.json) that transformers loads with from_pretrained (--force replaces one)."),
}


def get(name: str) -> Writer:
    if name not in TABLE:
        raise KeyError(f"no writer named {name!r}; known: {', '.join(TABLE)}")
    return importlib.import_module(TABLE[name].module).WRITER
