"""A SentencePiece model as the JSON that the browser's tokenizer (toolkit/web/site/tokenizer.mjs) reads.

Torch-free: it reads the shipped tokenizer.model with the sentencepiece package's own protobuf
description, so pieces, scores, piece types and the normaliser's flags are the model's, not a
re-derivation.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.core.errors import UsageError


def tokenizer_json(model_path: Path) -> dict:
    """Pieces as [piece, score, type] (sentencepiece's type numbers), the normaliser's flags,
    and whether byte fallback is on."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    try:
        proto.ParseFromString(Path(model_path).read_bytes())
    except Exception as e:  # a truncated or foreign file: protobuf raises DecodeError
        raise UsageError(f"tokenizer {model_path} is unreadable or corrupt ({type(e).__name__}); re-export the model directory") from None
    if proto.trainer_spec.model_type != pb.TrainerSpec.UNIGRAM:
        raise UsageError(f"tokenizer {model_path} is not a unigram model; the browser tokenizer implements unigram only")
    norm = proto.normalizer_spec
    if norm.precompiled_charsmap:
        # A character map (nmt_nfkc and the like) would need its own JavaScript port; tk trains with "identity".
        raise UsageError(f"tokenizer {model_path} uses the '{norm.name}' normalisation rule; the browser tokenizer supports 'identity' only")
    return {
        "pieces": [[p.piece, p.score, p.type] for p in proto.pieces],
        "byte_fallback": proto.trainer_spec.byte_fallback,
        "normalizer": {"name": norm.name, "add_dummy_prefix": norm.add_dummy_prefix,
                       "remove_extra_whitespaces": norm.remove_extra_whitespaces,
                       "escape_whitespaces": norm.escape_whitespaces},
    }


def write_tokenizer_json(model_path: Path, out: Path) -> None:
    out.write_text(json.dumps(tokenizer_json(model_path), ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
