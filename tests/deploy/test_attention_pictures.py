"""tk attention on the shipped Transformer, whose encoder and decoder differ in depth (6 + 2 layers)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_each_stack_is_drawn_with_its_own_depth(cli, tmp_path):
    """A picture per attention kind, each with its own stack's layers: the encoder's 6, the decoder's 2. With one
    depth for all three (the encoder's), the decoder's third layer was looked up and the command failed."""
    config = json.loads((REPO / "exported" / "transformer" / "manifest.json").read_text())["config"]
    assert config["num_layers"] != config.get("decoder_layers", config["num_layers"])  # what this test is about
    out = tmp_path / "att.png"
    result = cli("attention", REPO / "exported" / "transformer", "Tom bought a new car last week.", "-o", out,
                 "--json", tmp_path / "att.json")
    assert result.exit_code == 0, result.output
    for suffix in ("encoder", "decoder-self", "cross"):
        assert (tmp_path / f"att-{suffix}.png").stat().st_size > 0
    weights = json.loads((tmp_path / "att.json").read_text())
    text = json.dumps(weights)
    assert "encoder_attention_5" in text and "self_attention_1" in text and "self_attention_2" not in text
