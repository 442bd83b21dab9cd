"""Hugging Face M2M100ForConditionalGeneration in (M2M-100 and NLLB-200, which is the same architecture):
`tk export hf:DIR --out OUT`, the builder of toolkit.core.entries.m2m100, a member of the BART family
(toolkit.pytorch.bart_family).

What is M2M100's own: its scaled embeddings (M2M100ScaledWordEmbedding scales itself), its
sinusoidal positions counted from padding_idx + 1 (the table M2M100SinusoidalPositionalEmbedding holds, offset 2, the
padding's own position a zero row), its pre-LN layers and the final layer norms of encoder and decoder, the tied output
layer. Decoding follows generate: decoder_start_token_id (</s>), the target language's token forced first
(forced_bos_token_id), </s> forced at the length limit.

Tokenizers: M2M100Tokenizer's sentencepiece.bpe.model + vocab.json (its `__en__` codes after the vocabulary), or a
tokenizer.json (NLLB's, run by the `tokenizers` library) with its `eng_Latn` codes as added tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import DecodingRules
from toolkit.core.errors import UsageError
from toolkit.pytorch import bart_family, hf_files
from toolkit.pytorch.bart_family import FamilyForTk, FamilySettings, HfSource, multilingual_tokenizer, saved_language_tokens
from toolkit.pytorch.hf_files import inside
from toolkit.pytorch.registry import ModelEntry


@dataclass
class M2M100Settings(FamilySettings):
    """What tk keeps of an M2M100Config (FamilySettings' fields, M2M100's defaults)."""

    activation_function: str = "relu"
    scale_embedding: bool = True

    CONFIG, MODEL_CLASS = "M2M100Config", "M2M100ForConditionalGeneration"


def _positions(table: nn.Module, ids: torch.Tensor, past) -> torch.Tensor:
    """M2M100SinusoidalPositionalEmbedding's rows for `ids`, `past` positions in: its own position rule (counting
    from padding_idx + 1, padding at padding_idx) over its own table, without the forward's branch that grows the
    table (a data-dependent size the exporter cannot keep dynamic; tk's max_len stays within the table)."""
    # transformers 5 made the position rule a static method; 4.x has it as the module's function (same arguments).
    rule = getattr(table, "create_position_ids_from_input_ids", None)
    if rule is None:
        from transformers.models.m2m_100.modeling_m2m_100 import create_position_ids_from_input_ids as rule
    ids_pos = rule(ids, table.padding_idx, past)
    return table.weights.index_select(0, ids_pos.reshape(-1)).view(*ids.shape, -1)


class M2M100ForTk(FamilyForTk):
    """M2M100 as tk's graphs (bart_family.FamilyForTk): its self-scaling embeddings, its sinusoids counted from the
    padding."""

    def embed(self, stack: nn.Module, ids: torch.Tensor, past: int) -> torch.Tensor:
        return stack.embed_tokens(ids) + _positions(stack.embed_positions, ids, past)


def settings_from(config: dict, generation: dict, where: Path) -> tuple[M2M100Settings, DecodingRules, int | None]:
    """tk's settings, the end rules and the configured forced first token (None: none) from the two configs."""
    return bart_family.settings_from(M2M100Settings, config, generation, where)


def _spm_files(directory: Path, tok_config: dict, settings: M2M100Settings) -> tuple:
    """M2M100Tokenizer's sentencepiece.bpe.model + vocab.json, checked: (kind, files, pieces -> ids, language tokens,
    note)."""
    for name in ("sentencepiece.bpe.model", "vocab.json"):
        if not inside(directory, name).is_file():
            raise UsageError(f"{directory} has no tokenizer.json nor {name}; save the model's tokenizer beside it "
                             "(tokenizer.save_pretrained(DIR))")
    vocab = hf_files.vocabulary(directory, "vocab.json", settings.vocab_size, "vocab_size")
    hf_files.sentencepiece(directory / "sentencepiece.bpe.model", "an M2M100 directory holds M2M100Tokenizer's sentencepiece.bpe.model")
    # Its language tokens: saved in tokenizer_config.json, else its rule (`__xx__` of the named language_codes list,
    # numbered after vocab.json).
    added = saved_language_tokens(tok_config)
    if added is None:
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

        codes = FAIRSEQ_LANGUAGE_CODES.get(tok_config.get("language_codes", "m2m100"), FAIRSEQ_LANGUAGE_CODES["m2m100"])
        added = {len(vocab) + i: f"__{c}__" for i, c in enumerate(codes)}
    files = {"source": "sentencepiece.bpe.model", "vocab": "vocab.json"}
    return "m2m100", files, vocab, added, "M2M100Tokenizer (sentencepiece.bpe.model, vocab.json)"


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and the tokenizer files."""
    directory, config, generation, tok_config = bart_family.read_configs(source, "model and tokenizer")
    settings, rules, forced = settings_from(config, generation, directory)
    tokenizer, note = multilingual_tokenizer(directory, tok_config, settings, forced, _spm_files)
    rules = DecodingRules(**{**rules.to_dict(), "forced_first": tokenizer.languages[tokenizer.target_lang]})
    model, files = bart_family.load_weights(M2M100ForTk, settings, directory, bart_family.tied(settings))
    return HfSource(directory, settings, rules, model, files, tokenizer, bart_family.beams(config, generation), "m2m100", note)


MODEL = ModelEntry("m2m100", M2M100Settings, M2M100ForTk.build, M2M100Settings.graphs)
