"""The node map written beside each exported graph: node name -> [PyTorch module path, class, source line],
from the exporter's own metadata. Reports (verify --localize, the int8 layer table) name modules with it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.core.manifest import Manifest


def node_map_name(graph_file: str) -> str:
    """The map's file name beside a graph file: decoder.onnx -> decoder.nodes.json."""
    return graph_file.removesuffix(".onnx") + ".nodes.json"


def node_origins(m: Manifest, graph: str) -> dict[str, list[str]]:
    """The export's node map for a graph, or {} for a directory exported before tk wrote one."""
    path = m.directory / node_map_name(m.graphs[graph].file)
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
