"""Hugging Face BartForConditionalGeneration in (BART and its fine-tunes): `tk export hf:DIR --out OUT`, the builder of
toolkit.core.entries.bart, the BART family's base itself (toolkit.pytorch.bart_family).

BART computes as the base does: embeddings scaled where the config says so (BartScaledWordEmbedding), learned positions
offset by 2, `layernorm_embedding`, post-LN layers with no final layer norms, the tied output layer and its
`final_logits_bias`. Decoding follows generate: the decoder started with </s> (decoder_start_token_id), <s> forced
first where the configs force it (bart-large's forced_bos_token_id 0), </s> forced at the length limit, the generation
config's beam rule.

Tokenizer: the directory's tokenizer.json (GPT-2's byte-level BPE, as BartTokenizerFast saves it), run by the
`tokenizers` library with the file's own post-processor (`<s> text </s>`): the "tokenizer.json" kind, without languages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.declaration import TokenizerDeclaration
from toolkit.core.errors import UsageError
from toolkit.pytorch import bart_family
from toolkit.pytorch.bart_family import FamilyForTk, FamilySettings, HfSource
from toolkit.pytorch.hf_files import inside
from toolkit.pytorch.registry import ModelEntry


@dataclass
class BartSettings(FamilySettings):
    """What tk keeps of a BartConfig: the base's fields and defaults, which are BART's."""


def _tokenizer(directory: Path, settings: BartSettings) -> TokenizerDeclaration:
    """The directory's tokenizer.json, checked: it loads, its ids fit the model's vocabulary, it has <unk>."""
    from toolkit.core.tokenizers import load_tokenizer_json

    path = inside(directory, "tokenizer.json")
    if not path.is_file():
        raise UsageError(f"{directory} has no tokenizer.json; save BART's fast tokenizer beside the model "
                         "(BartTokenizerFast.from_pretrained(DIR).save_pretrained(DIR))")
    vocab = load_tokenizer_json(path, "save the model's tokenizer again (tokenizer.save_pretrained(DIR))").get_vocab(with_added_tokens=True)
    top = max(vocab.values(), default=0)
    if top >= settings.vocab_size:
        raise UsageError(f"{path}: token id {top} is outside the model's vocabulary of {settings.vocab_size} (config.json vocab_size)")
    if "<unk>" not in vocab:
        raise UsageError(f"{path}: the tokenizer has no <unk> token")
    return TokenizerDeclaration(kind="tokenizer.json", source="tokenizer.json", unk=vocab["<unk>"])


def settings_from(config: dict, generation: dict, where: Path) -> tuple[BartSettings, object, int | None]:
    """BART's settings, decoding rules and forced first token from config.json and generation_config.json, checked."""
    return bart_family.settings_from(BartSettings, config, generation, where)


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and tokenizer.json."""
    directory, config, generation, _ = bart_family.read_configs(source, "model and tokenizer")
    settings, rules, forced = settings_from(config, generation, directory)
    tokenizer = _tokenizer(directory, settings)
    # Besides the tied entries: the output bias, which transformers starts at zero when absent.
    model, files = bart_family.load_weights(FamilyForTk, settings, directory, bart_family.tied(settings) | {"final_logits_bias"})
    return HfSource(directory, settings, dataclasses.replace(rules, forced_first=forced), model, files, tokenizer,
                    bart_family.beams(config, generation), "bart", "BartTokenizerFast (tokenizer.json, byte-level BPE)")


MODEL = ModelEntry("bart", BartSettings, FamilyForTk.build, BartSettings.graphs)
