"""HTML (.html, .htm): the whole document through toolkit.deploy.markup, its markup kept byte for byte and only its text
translated."""

from __future__ import annotations

from toolkit.deploy import markup
from toolkit.deploy.files.document import Document
from toolkit.deploy.files.safety import Limits
from toolkit.deploy.files.text import decode


def read_html(data: bytes, name: str, limits: Limits) -> Document:
    text, bom = decode(data, name)
    plan = markup.plan(text)
    texts = plan.texts()
    return Document(name, "html", texts, [f"text {k}" for k in range(1, len(texts) + 1)],
                    lambda translated: bom + markup.render(plan, translated).encode("utf-8"))
