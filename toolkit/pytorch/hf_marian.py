"""Hugging Face MarianMTModel in (the OPUS-MT family): a `save_pretrained` directory as a tk translation model (`tk
export hf:DIR --out OUT`), the builder of toolkit.core.entries.marian, a member of the BART family
(toolkit.pytorch.bart_family).

What is Marian's own: scaled embeddings when the config says so, its sinusoidal positions (sines in the first half,
cosines in the second), post-LN layers (no final layer norms), the output bias final_logits_bias, a target vocabulary
of its own when the sides do not share one, the start token (decoder_start_token_id, the pad id), and MarianTokenizer's
files (a SentencePiece model per side, vocab.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration
from toolkit.core.entries.marian import ENTRY
from toolkit.core.errors import UsageError
from toolkit.pytorch import bart_family, hf_files
from toolkit.pytorch.bart_family import FamilyForTk, FamilySettings, HfSource
from toolkit.pytorch.hf_files import inside
from toolkit.pytorch.registry import ModelEntry

# transformers' MarianMTModel leaves these out of what it saves: it computes them at load.
COMPUTED = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


@dataclass
class MarianSettings(FamilySettings):
    """What tk keeps of a MarianConfig (FamilySettings' fields, Marian's defaults, and its target vocabulary)."""

    eos_token_id: int = 0
    decoder_start_token_id: int = 1
    activation_function: str = "swish"
    scale_embedding: bool = True
    decoder_vocab_size: int = 128
    share_encoder_decoder_embeddings: bool = True

    CONFIG, MODEL_CLASS = "MarianConfig", "MarianMTModel"
    OUTPUT_VOCAB = ("decoder_vocab_size", "target vocabulary")

    def __post_init__(self) -> None:
        if self.share_encoder_decoder_embeddings:  # one vocabulary: the decoder's is the encoder's
            self.decoder_vocab_size = self.vocab_size


class MarianForTk(FamilyForTk):
    """MarianMTModel as tk's graphs (bart_family.FamilyForTk): its embeddings scaled by embed_scale, its sinusoids."""

    def embed(self, stack: nn.Module, ids: torch.Tensor, past: int) -> torch.Tensor:
        return stack.embed_tokens(ids) * stack.embed_scale + stack.embed_positions(ids.shape, past)


def settings_from(config: dict, generation: dict, where: Path) -> tuple[MarianSettings, DecodingRules]:
    """tk's settings and decoding rules from config.json and generation_config.json."""
    if config.get("model_type") not in ENTRY.hf_model_types:  # the entry names what tk imports
        from toolkit.core.architectures import for_hf_model_type

        for_hf_model_type(config.get("model_type"), f"{where}/config.json")
    if config.get("normalize_before") or config.get("add_final_layer_norm") or config.get("normalize_embedding"):
        raise UsageError(f"{where}/config.json asks for layer norms MarianMTModel does not have; is it a Marian model?")
    # A Marian without decoder_vocab_size (or with null) shares its one vocabulary.
    settings, rules, _ = bart_family.settings_from(
        MarianSettings, config, generation, where,
        lambda name, c: c.get("vocab_size", MarianSettings().vocab_size) if name == "decoder_vocab_size" else None)
    return settings, rules


SPM_HINT = "a Hugging Face Marian directory holds MarianTokenizer's source.spm and target.spm (tokenizer.save_pretrained)"


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and MarianTokenizer files."""
    directory, config, generation, tok_config = bart_family.read_configs(source, "model and MarianTokenizer")
    settings, rules = settings_from(config, generation, directory)
    separate = bool(tok_config.get("separate_vocabs", False))
    for name in ("source.spm", "target.spm", "vocab.json") + (("target_vocab.json",) if separate else ()):
        if not inside(directory, name).is_file():
            raise UsageError(f"{directory} has no {name}; save the MarianTokenizer beside the model (tokenizer.save_pretrained(DIR))")
    vocab = hf_files.vocabulary(directory, "vocab.json", settings.vocab_size, "vocab_size")
    if separate:
        hf_files.vocabulary(directory, "target_vocab.json", settings.decoder_vocab_size, "decoder_vocab_size")
    for name in ("source.spm", "target.spm"):
        hf_files.sentencepiece(directory / name, SPM_HINT)
    unk = vocab.get(tok_config.get("unk_token", "<unk>") if isinstance(tok_config.get("unk_token", "<unk>"), str) else "<unk>")
    if unk is None:
        raise UsageError(f"{directory}/vocab.json has no <unk> piece")
    tokenizer = TokenizerDeclaration(kind="marian", source="source.spm", target="target.spm", vocab="vocab.json",
                                     target_vocab="target_vocab.json" if separate else None, unk=unk)
    # Besides the tied entries: the output bias (transformers starts a missing one at zero) and the positions
    # transformers computes at load.
    optional = {"final_logits_bias", *COMPUTED} | ({"lm_head.weight"} if settings.tie_word_embeddings else set())
    if settings.share_encoder_decoder_embeddings:
        optional |= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    model, files = bart_family.load_weights(MarianForTk, settings, directory, optional, tie=False)
    return HfSource(directory, settings, rules, model, files, tokenizer, bart_family.beams(config, generation), "marian",
                    "MarianTokenizer (source.spm, target.spm, vocab.json)")


MODEL = ModelEntry("marian", MarianSettings, MarianForTk.build, MarianSettings.graphs)
