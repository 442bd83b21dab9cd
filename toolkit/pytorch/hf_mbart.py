"""Hugging Face MBartForConditionalGeneration in (mBART-cc25 and its fine-tunes, mBART-50): `tk export hf:DIR --out
OUT`, the builder of toolkit.core.entries.mbart, a member of the BART family (toolkit.pytorch.bart_family).

What is mBART's own: its scaled embeddings (MBartScaledWordEmbedding scales itself), its learned
positions (MBartLearnedPositionalEmbedding, rows offset by 2), `layernorm_embedding` after embeddings and positions, its
pre-LN layers, the final `layer_norm` of encoder and decoder, the tied output layer and its `final_logits_bias` (zeros
in the released checkpoints, so an exporter that drops it goes unnoticed until a fine-tune sets it).

The two tokenizers place the language codes differently, and the decoder starts accordingly:
- MBart50Tokenizer (mBART-50): source `[en_XX] text </s>`; decoder start </s> (decoder_start_token_id), the target
  language's token forced first (forced_bos_token_id), as M2M100 does.
- MBartTokenizer (mBART-cc25, mbart-large-en-ro): source `text </s> en_XX`; the decoder starts with the target
  language's token itself (its training shifts `text </s> ro_RO` right, so the code comes first), nothing forced.
Both end with </s> forced at the length limit and follow generate's beam rule.

Tokenizer files: a tokenizer.json (run by the `tokenizers` library, as transformers 5 runs it), else the
sentencepiece.bpe.model (tk's "mbart" kind: fairseq's ids, the SentencePiece model's shifted by one, the language codes
after the SentencePiece vocabulary, then <mask>).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration
from toolkit.core.errors import UsageError
from toolkit.pytorch import bart_family, hf_files
from toolkit.pytorch.bart_family import (
    FamilyForTk,
    FamilySettings,
    HfSource,
    default_language,
    language_codes,
    multilingual_tokenizer,
    saved_language_tokens,
)
from toolkit.pytorch.hf_files import generation_fields, inside
from toolkit.pytorch.registry import ModelEntry

# The tokenizer classes that put the source's code first (mBART-50); every other mBART tokenizer puts it last.
PREFIX_CLASSES = ("MBart50Tokenizer", "MBart50TokenizerFast")


@dataclass
class MBartSettings(FamilySettings):
    """What tk keeps of an MBartConfig (FamilySettings' fields and defaults); decoder_start_token_id is the decoder's
    first input tk uses by default (see read: cc25's is a language code)."""

    CONFIG, MODEL_CLASS = "MBartConfig", "MBartForConditionalGeneration"


class MBartForTk(FamilyForTk):
    """mBART as tk's graphs: the family's own computation (learned positions, layernorm_embedding, final layer norms,
    final_logits_bias: zeros in the released checkpoints, so an exporter that drops it goes unnoticed until a
    fine-tune sets it)."""


def _start_fallback(name: str, config: dict) -> object:
    """generate's decoder start when the configs give none: bos_token_id (MBartConfig's default 0)."""
    return config.get("bos_token_id", 0) if name == "decoder_start_token_id" else None


def settings_from(config: dict, generation: dict, where: Path) -> tuple[MBartSettings, DecodingRules, int | None]:
    """tk's settings, the end rules and the configured forced first token (None: none) from the two configs."""
    # A null field is an unset one (mbart-large-cc25's config.json writes decoder_start_token_id: null).
    gen = {k: v for k, v in generation_fields(config, generation).items() if v is not None}
    return bart_family.settings_from(MBartSettings, config, generation, where, _start_fallback, gen)


def _codes_first(directory: Path, tok_config: dict) -> bool:
    """Whether the source's language code goes before the text (MBart50Tokenizer) or after its </s> (MBartTokenizer):
    the class tokenizer_config.json names (AutoTokenizer's choice), else the template of tokenizer.json's post-processor,
    else MBartTokenizer (AutoTokenizer's tokenizer for model_type mbart)."""
    named = tok_config.get("tokenizer_class")
    if isinstance(named, str) and named.startswith("MBart"):
        return named in PREFIX_CLASSES
    path = inside(directory, "tokenizer.json")
    if path.is_file():
        from toolkit.core.tokenizers import MAX_VOCAB_BYTES, read_json_object

        post = read_json_object(path, MAX_VOCAB_BYTES, "a tokenizer.json").get("post_processor")
        single = post.get("single") if isinstance(post, dict) else None
        if isinstance(single, list) and single and isinstance(single[0], dict):
            return "SpecialToken" in single[0]
    return False


def _fairseq_language_tokens(tok_config: dict, pieces: int, codes_first: bool) -> dict[int, str]:
    """The language tokens of a sentencepiece.bpe.model tokenizer: its saved added_tokens_decoder where it has them,
    else the class's rule (its FAIRSEQ_LANGUAGE_CODES numbered after the SentencePiece pieces, shifted by fairseq's
    offset of 1)."""
    saved = saved_language_tokens(tok_config)
    if saved is not None:
        return saved
    if codes_first:
        from transformers.models.mbart50.tokenization_mbart50 import FAIRSEQ_LANGUAGE_CODES
    else:
        from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES
    return {pieces + 1 + i: c for i, c in enumerate(FAIRSEQ_LANGUAGE_CODES)}


def _spm_tokenizer(directory: Path, tok_config: dict, settings: MBartSettings, codes_first: bool) -> tuple[TokenizerDeclaration, str]:
    """tk's "mbart" kind over the directory's sentencepiece.bpe.model, checked: it loads, and its ids, language codes
    and <mask> fit the model's vocabulary."""
    path = inside(directory, "sentencepiece.bpe.model")
    if not path.is_file():
        raise UsageError(f"{directory} has no tokenizer.json nor sentencepiece.bpe.model; save the model's tokenizer beside it "
                         "(tokenizer.save_pretrained(DIR))")
    hf_files.sentencepiece(path, "an mBART directory holds MBartTokenizer's sentencepiece.bpe.model")
    import sentencepiece as spm

    pieces = spm.SentencePieceProcessor(model_proto=path.read_bytes()).get_piece_size()
    if pieces + 1 > settings.vocab_size:  # fairseq's ids: every piece one up
        raise UsageError(f"{path}: its {pieces} pieces (ids up to {pieces}) do not fit the model's vocabulary of "
                         f"{settings.vocab_size} (config.json vocab_size)")
    added = _fairseq_language_tokens(tok_config, pieces, codes_first)
    codes = language_codes(added, settings.vocab_size, directory)
    declared = TokenizerDeclaration(kind="mbart", source="sentencepiece.bpe.model", unk=3, languages=codes,
                                    lang_suffix=not codes_first, source_lang=default_language(tok_config, "src_lang", codes, None),
                                    target_lang=default_language(tok_config, "tgt_lang", codes, None))
    name = "MBart50Tokenizer" if codes_first else "MBartTokenizer"
    return declared, f"{name} (sentencepiece.bpe.model, fairseq ids)"


def _decoding(settings: MBartSettings, rules: DecodingRules, tokenizer: TokenizerDeclaration, codes_first: bool,
              forced: int | None, config: dict, generation: dict) -> tuple[MBartSettings, DecodingRules, TokenizerDeclaration]:
    """The start and forced first token, and the default target language, of the model's tokenizer's convention.

    The decoder starts with the target's code (mBART-cc25: nothing forced; a target language chosen later replaces the
    start token) when the configs start it with a language code, or when an MBartTokenizer model names no start and
    no forced token: generate would start it with <s> (bos), which no mBART was trained to follow, where the model
    card's generate(decoder_start_token_id=lang_code_to_id[...]) gives the code. Otherwise (mBART-50) the configured
    start and the target's code forced first, as M2M100."""
    by_id = {i: c for c, i in tokenizer.languages.items()}
    named = generation.get("decoder_start_token_id") is not None or config.get("decoder_start_token_id") is not None
    if forced is None and (settings.decoder_start_token_id in by_id or (not codes_first and not named)):
        target = by_id.get(settings.decoder_start_token_id, tokenizer.target_lang)
        start = tokenizer.languages[target]
        settings = dataclasses.replace(settings, decoder_start_token_id=start)
        rules = DecodingRules(**{**rules.to_dict(), "start": start, "forced_first": None})
    else:
        target = by_id.get(forced, tokenizer.target_lang)
        rules = DecodingRules(**{**rules.to_dict(), "forced_first": tokenizer.languages[target]})
    return settings, rules, dataclasses.replace(tokenizer, target_lang=target)


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and the tokenizer files."""
    directory, config, generation, tok_config = bart_family.read_configs(source, "model and tokenizer")
    settings, rules, forced = settings_from(config, generation, directory)
    codes_first = _codes_first(directory, tok_config)
    if inside(directory, "tokenizer.json").is_file():
        tokenizer, note = multilingual_tokenizer(directory, tok_config, settings, forced)
        tokenizer = dataclasses.replace(tokenizer, lang_suffix=not codes_first)
        note = f"{'MBart50Tokenizer' if codes_first else 'MBartTokenizer'} ({note})"
    else:
        tokenizer, note = _spm_tokenizer(directory, tok_config, settings, codes_first)
    settings, rules, tokenizer = _decoding(settings, rules, tokenizer, codes_first, forced, config, generation)
    # Besides the tied entries: the output bias, which transformers starts at zero when absent.
    optional = bart_family.tied(settings) | {"final_logits_bias"}
    model, files = bart_family.load_weights(MBartForTk, settings, directory, optional)
    return HfSource(directory, settings, rules, model, files, tokenizer, bart_family.beams(config, generation), "mbart", note)


MODEL = ModelEntry("mbart", MBartSettings, MBartForTk.build, MBartSettings.graphs)
