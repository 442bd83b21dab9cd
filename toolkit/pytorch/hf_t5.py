"""Hugging Face T5ForConditionalGeneration in (T5, T5 v1.1, Flan-T5; MT5ForConditionalGeneration for mT5):
`tk export hf:DIR --out OUT`, the builder of toolkit.core.entries.t5 (what it shares with the BART family:
toolkit.pytorch.bart_family's LayerCache, HfSource, write_files).

`T5ForTk` computes tk's graphs (an encoder graph with every decoder layer's cross keys/values, a one-step decoder over
per-layer self-attention caches) by calling the model's own T5Block modules, so the exported nodes carry transformers'
module paths (decoder.block.1.layer.2.DenseReluDense.act) and `tk verify --localize` names them. What T5 does that
tk's other imports do not, and where it happens here:

- no absolute positions: a relative position bias, bucketed (bidirectional in the encoder, causal in the decoder),
  computed by the first block of each stack and handed to the others. In the one-step decoder the bias is the one
  query at position `past` against keys 0..past, `past` being the self-attention cache's length (a dynamic axis of
  the graph, read from the cache's shape: the step position is never an input of its own);
- T5LayerNorm is RMSNorm (no mean subtraction, no bias); pre-norm blocks and a final norm per stack;
- attention scores are not divided by sqrt(d_kv) (T5 folds it into its initialisation) and d_kv is its own size,
  not d_model / num_heads: tk's cache tensors are (batch, heads, positions, d_kv), declared here (`graphs`);
- the feed-forward is relu (T5 v1.0) or gated (`feed_forward_proj: gated-gelu`, Flan-T5, T5 v1.1, mT5);
- the output layer, the one computation the two transformers lines tk supports do differently, so it follows the
  line installed at export (`output_layer`; the choice is baked into the decoder graph and kept in the manifest's
  config as scale_decoder_outputs and tie_word_embeddings, so every runtime decodes as that line's generate).
  transformers 5: T5ForConditionalGeneration rescales the decoder output by d_model**-0.5 before lm_head when its config
  says so (`scale_decoder_outputs`, from `tie_word_embeddings` of older configs), MT5ForConditionalGeneration never
  does; lm_head is the shared embedding unless the weights hold an lm_head of their own that differs (T5 v1.1, mT5).
  transformers 4: both classes rescale and tie lm_head to the embedding exactly when `tie_word_embeddings` is true
  (T5Config's default true, MT5Config's false), whatever lm_head the weights hold. The lines part on every directory
  transformers 5 writes for an mT5 or an untied T5 (it always writes tie_word_embeddings true): the rescaling is a
  temperature on the logits, so greedy tokens agree and beam search does not. Their beam searches themselves are
  the same code (`_beam_search`; 5.x only takes the vocabulary size from the logits instead of the config).

Decoding follows generate: start at decoder_start_token_id (the pad id, 0), end at </s> (1), no forced first token.
T5 has no language codes; what it translates is chosen by a task prefix on the source text ("translate English to
French: "), which config.json's task_specific_params lists per pair (translation_en_to_fr: {prefix: ...}). tk keeps
those prefixes in the declaration (tokenizer.prefixes, "en-fr" -> prefix) and applies one only when a pair is chosen:
`tk export hf:DIR --source-lang en --target-lang fr` records it as the directory's default, and `tk translate
--source-lang/--target-lang` (Translator.translate(source_lang=..., target_lang=...)) picks one per call. With no pair
the text goes in as it is, as `generate` on raw text. A pair the config does not declare is refused in one line that
lists the ones it does (toolkit.core.tokenizers.t5_pair).

Tokenizers: spiece.model (SentencePiece unigram, its ids are the model's, `</s>` appended, `<extra_id_N>` sentinels
after the pieces) or tokenizer.json (what transformers 5's T5Tokenizer saves, run by the `tokenizers` library); the
deploy side reads either without torch (toolkit.core.tokenizers.T5SourceTokenizer).

fp16: T5 is known to overflow in float16 (feed-forward activations past 65504; transformers clamps them in its blocks,
CTranslate2 #1074). tk does not refuse `--fp16` for a T5 yet, and the clamp is not in the exported graphs (they are
traced in float32, where transformers skips it). The fp16 variant is a CUDA variant: verify on a GPU holds its steps to
fp16's tolerances against the float32 PyTorch reference, so an overflow (inf/NaN log-probabilities) fails verify (exit
1); it does not demand generate's tokens of fp16 (the variant is not exact). Not measured on a T5: no GPU here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration, layer_key
from toolkit.core.errors import UsageError
from toolkit.core.graphs import FLOAT, SRC, GraphSpec, TensorSpec, decoder_graph
from toolkit.pytorch import hf_files
from toolkit.pytorch.bart_family import HfSource, LayerCache, beams, read_configs, source_mask, suppress_mask
from toolkit.pytorch.hf_files import check_weights, forbidden, generation_fields, inside, meta_shapes
from toolkit.pytorch.hf_layers import call_layer
from toolkit.pytorch.registry import ModelEntry

MODEL_CLASSES = {"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration"}
# The activations transformers' ACT2FN gives T5's feed-forward that tk exports; "gated-" before one: the gated form.
ACTIVATIONS = ("relu", "gelu", "gelu_new", "gelu_fast", "silu", "swish", "gelu_pytorch_tanh")
# A key of task_specific_params that names a translation pair: translation_en_to_fr.
TRANSLATION_TASK = re.compile(r"translation_([a-z]{2,3}(?:[-_][A-Za-z]{2,4})?)_to_([a-z]{2,3}(?:[-_][A-Za-z]{2,4})?)")


@dataclass
class T5Settings:
    """What tk keeps of a T5Config/MT5Config: every field its computation depends on (the manifest's "config"). The
    layer counts are named as tk's other imports name them (the manifest bounds them); config.json's num_layers and
    num_decoder_layers are read into them."""

    vocab_size: int = 128
    d_model: int = 32
    d_kv: int = 8
    d_ff: int = 64
    encoder_layers: int = 2  # config.json num_layers
    decoder_layers: int = 2  # config.json num_decoder_layers (num_layers when absent)
    num_heads: int = 4
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    scale_decoder_outputs: bool = True  # the decoder output times d_model**-0.5 before lm_head
    tie_word_embeddings: bool = True  # lm_head is the shared embedding (False: the weights hold their own)
    model_type: str = "t5"  # "t5" or "mt5": which transformers class is the reference
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    max_len: int = 512  # tk's source/output bound: T5 has no position table; config.json n_positions, at most 1024
    suppress_tokens: str = ""  # comma-separated ids the decoder graph gives -inf

    # tk's own fields, or fields tk derives, not read from config.json as they are
    OWN = ("max_len", "suppress_tokens", "encoder_layers", "decoder_layers", "tie_word_embeddings", "model_type",
           "scale_decoder_outputs")
    # fields the installed transformers line decides (`output_layer`): 4.x and 5.x read one config.json apart
    LINE_DEPENDENT = ("scale_decoder_outputs", "tie_word_embeddings")

    def hf_config(self):
        from transformers import MT5Config, T5Config

        cls = MT5Config if self.model_type == "mt5" else T5Config
        # tie_word_embeddings given: transformers 4 rescales and ties by it (the class defaults differ); 5 always ties
        config = cls(vocab_size=self.vocab_size, d_model=self.d_model, d_kv=self.d_kv, d_ff=self.d_ff,
                     tie_word_embeddings=self.tie_word_embeddings,
                     num_layers=self.encoder_layers, num_decoder_layers=self.decoder_layers, num_heads=self.num_heads,
                     relative_attention_num_buckets=self.relative_attention_num_buckets,
                     relative_attention_max_distance=self.relative_attention_max_distance,
                     layer_norm_epsilon=self.layer_norm_epsilon, feed_forward_proj=self.feed_forward_proj, dropout_rate=0.0,
                     pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id,
                     decoder_start_token_id=self.decoder_start_token_id)
        config.scale_decoder_outputs = self.scale_decoder_outputs  # T5's; MT5ForConditionalGeneration never scales
        config._attn_implementation = "eager"
        return config

    def suppressed(self) -> list[int]:
        return [int(t) for t in self.suppress_tokens.split(",") if t]

    def activation(self) -> str:
        return self.feed_forward_proj.removeprefix("gated-")


def _check(settings: T5Settings, where: str) -> None:
    """Refuses, before anything is allocated, a config tk cannot build: sizes within the manifest's bounds (T5's
    own among them), token ids inside the vocabulary, a feed-forward tk exports."""
    proj = settings.feed_forward_proj
    if proj.count("-") > 1 or ("-" in proj and not proj.startswith("gated-")) or settings.activation() not in ACTIVATIONS:
        raise UsageError(f"{where}: feed_forward_proj {proj!r} is not one tk exports ({', '.join(ACTIVATIONS)}, each "
                         "optionally as gated-NAME)")
    if not 0.0 < settings.layer_norm_epsilon < 1.0:
        raise UsageError(f"{where}: layer_norm_epsilon must be between 0 and 1, got {settings.layer_norm_epsilon}")
    if settings.model_type not in MODEL_CLASSES:
        raise UsageError(f"{where}: model_type {settings.model_type!r} is not a T5 ({', '.join(MODEL_CLASSES)})")
    hf_files.check_sizes(settings, where, settings.vocab_size)


def _hf_model(settings: T5Settings) -> nn.Module:
    from transformers import MT5ForConditionalGeneration, T5ForConditionalGeneration

    cls = MT5ForConditionalGeneration if settings.model_type == "mt5" else T5ForConditionalGeneration
    return cls(settings.hf_config())


def build(settings: T5Settings) -> T5ForTk:
    """A T5ForConditionalGeneration (MT5ForConditionalGeneration) of these settings, randomly initialised (weights are
    loaded after), for tk; lm_head a parameter of its own when the settings say it is not the shared embedding."""
    _check(settings, "config")
    hf = _hf_model(settings).eval()
    if not settings.tie_word_embeddings:
        hf.lm_head.weight = nn.Parameter(hf.shared.weight.detach().clone())
    return T5ForTk(hf, settings)


def graphs(settings: T5Settings) -> list[GraphSpec]:
    """tk's cache layout with T5's sizes: keys and values of d_kv per head (not d_model / heads)."""
    h, dk, layers = settings.num_heads, settings.d_kv, range(settings.decoder_layers)
    cross = tuple(TensorSpec(layer_key(n, i), FLOAT, ("batch", h, "src_len", dk)) for i in layers for n in ("cross_k", "cross_v"))
    past = tuple(TensorSpec(layer_key(n, i), FLOAT, ("batch", h, "past_len", dk), "empty") for i in layers for n in ("self_k", "self_v"))
    encoder = GraphSpec("encoder", SRC, (TensorSpec("memory", FLOAT, ("batch", "src_len", settings.d_model)), *cross))
    return [encoder, decoder_graph(past, cross, settings.vocab_size)]


class _T5LayerCache(LayerCache):
    """LayerCache (self-attention grows by one position, cross-attention returns the encoder graph's keys/values)
    plus the length T5Attention reads before it computes the relative bias: the past positions, from the cache's
    shape, so the exported graph derives the step's position from its dynamic past_len axis."""

    def get_seq_length(self, layer_idx: int = 0):
        return self.past_k.shape[2]


class T5ForTk(nn.Module):
    """T5's computation split as tk's graphs are (see the module's docstring); holds the Hugging Face model's own
    modules under their own names (shared, encoder, decoder, lm_head), so parameter names are transformers'."""

    def __init__(self, hf: nn.Module, settings: T5Settings):
        super().__init__()
        self.shared, self.encoder, self.decoder, self.lm_head = hf.shared, hf.encoder, hf.decoder, hf.lm_head
        self.settings = settings
        self.register_buffer("suppress", suppress_mask(hf, settings), persistent=False)
        object.__setattr__(self, "hf", hf)  # the whole model, for generate(); not a second submodule

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> dict[str, torch.Tensor]:
        enc = self.encoder
        x = enc.embed_tokens(src)
        mask = source_mask(src_len, src.shape[1])
        bias = None  # block 0 computes the bidirectional relative bias; the others reuse it, as T5Stack does
        positions = torch.arange(src.shape[1], device=src.device)
        for block in enc.block:
            x, bias = call_layer(block, x, mask, bias, positions=positions, all_outputs=True)[:2]
        x = enc.final_layer_norm(x)
        out = {"memory": x, "src_len": src_len}
        b, n, _ = x.shape
        for i, block in enumerate(self.decoder.block):
            att = block.layer[1].EncDecAttention
            for name, proj in (("cross_k", att.k), ("cross_v", att.v)):
                out[layer_key(name, i)] = proj(x).view(b, n, -1, att.key_value_proj_dim).transpose(1, 2)
        return out

    def decode_step(self, token: torch.Tensor, cache: dict[str, torch.Tensor]):
        dec = self.decoder
        x = dec.embed_tokens(token[:, None])
        cross_mask = source_mask(cache["src_len"], cache[layer_key("cross_k", 0)].shape[2])
        self_bias = cross_bias = None  # computed by block 0 (the causal bias of position `past`), reused after
        past = cache[layer_key("self_k", 0)].shape[2]
        positions = torch.arange(past, past + 1, device=token.device)
        new = {}
        for i, block in enumerate(dec.block):
            sk, sv, ck, cv = (layer_key(name, i) for name in ("self_k", "self_v", "cross_k", "cross_v"))
            layer_cache = _T5LayerCache(cache[sk], cache[sv], cache[ck], cache[cv])
            # No causal mask: the cache holds only earlier positions. The encoder states passed are a stand-in (the
            # cache returns the encoder graph's keys/values); their unused projections are dropped from the graph.
            x, self_bias, cross_bias = call_layer(block, x, None, self_bias, x, cross_mask, cross_bias, layer_cache=layer_cache,
                                                  positions=positions, all_outputs=True)[:3]
            new[sk], new[sv] = layer_cache.new_k, layer_cache.new_v
        h = dec.final_layer_norm(x)[:, 0]
        if self.settings.scale_decoder_outputs:  # T5's tied output layer, as T5ForConditionalGeneration.forward
            h = h * (self.settings.d_model ** -0.5)
        logits = self.lm_head(h)
        # As generate: log-softmax first, then the forbidden tokens at -inf (the others are not renormalised).
        return torch.log_softmax(logits, dim=-1) + self.suppress, {**cache, **new}


# ---- reading a Hugging Face directory -----------------------------------------------------------------------------

def _config_field(name: str, config: dict):
    """config.json's spelling of the fields tk names otherwise (see T5Settings)."""
    if name == "encoder_layers":
        return config.get("num_layers")
    if name == "decoder_layers":
        return config.get("num_decoder_layers", config.get("num_layers"))
    return None


def transformers_line() -> int:
    """The major version of the installed transformers (4 or 5): the line whose output layer tk follows."""
    import transformers

    return int(transformers.__version__.split(".")[0])


def output_layer(config: dict, model_type: str, where: Path, line: int) -> tuple[bool, bool | None]:
    """(rescaled, tied) as transformers of major version `line` builds the output layer of this config.json: whether the
    decoder output is multiplied by d_model**-0.5 before lm_head, and whether lm_head is the shared embedding (None: as
    the weights say, in read)."""
    for name in ("scale_decoder_outputs", "tie_word_embeddings"):
        if name in config and type(config[name]) is not bool:
            raise UsageError(f"{where}/config.json: {name} must be true or false, got {config[name]!r:.40}")
    if line < 5:  # one flag for both, defaulting as T5Config (true) and MT5Config (false) do
        tied = config.get("tie_word_embeddings", model_type == "t5")
        return tied, tied
    # T5 scales unless its config says not to (scale_decoder_outputs, or tie_word_embeddings false in a config written
    # before that field); MT5ForConditionalGeneration has no scaling at all.
    scale = config.get("scale_decoder_outputs", config.get("tie_word_embeddings", True) is not False)
    return scale and model_type == "t5", None


def settings_from(config: dict, generation: dict, where: Path) -> tuple[T5Settings, DecodingRules]:
    """tk's settings and the decoding rules from the two configs, the output layer as the installed transformers
    builds it (under transformers 5 the weights decide tie_word_embeddings, in read)."""
    gen = generation_fields(config, generation)
    skip = tuple(n for n in T5Settings.OWN if n not in ("encoder_layers", "decoder_layers"))
    values = hf_files.config_values(T5Settings, config, gen, where, skip, _config_field)
    model_type = config.get("model_type")
    scale, tied = output_layer(config, model_type, where, transformers_line())
    positions = config.get("n_positions", 512)
    positions = positions if type(positions) is int and positions >= 2 else 512
    origin = lambda key: f"{where}/{'generation_config.json' if key in generation else 'config.json'}"  # noqa: E731
    settings = T5Settings(**values, model_type=model_type, scale_decoder_outputs=scale, tie_word_embeddings=tied is not False,
                          max_len=min(positions, 1024), suppress_tokens=forbidden(gen, origin))
    _check(settings, f"{where}/config.json")
    return settings, hf_files.end_rules(settings, config, gen, origin, where)


def task_prefixes(config: dict, where: Path) -> dict[str, str]:
    """The translation prefixes config.json's task_specific_params declares: "en-fr" -> "translate English to French: "."""
    tasks = config.get("task_specific_params") or {}
    if not isinstance(tasks, dict):
        raise UsageError(f"{where}/config.json: task_specific_params must be an object of tasks, got {tasks!r:.40}")
    prefixes = {}
    for task, params in tasks.items():
        found = TRANSLATION_TASK.fullmatch(task) if isinstance(task, str) else None
        if found is None:
            continue  # summarization and the other tasks translate nothing
        prefix = params.get("prefix") if isinstance(params, dict) else None
        if not isinstance(prefix, str) or len(prefix) > 200:
            raise UsageError(f"{where}/config.json: task_specific_params.{task}.prefix must be a string (at most 200 "
                             f"characters), got {prefix!r:.40}")
        prefixes[f"{found.group(1)}-{found.group(2)}"] = prefix
    return prefixes


def _tokenizer(directory: Path, settings: T5Settings, prefixes: dict[str, str], tok_config: dict) -> tuple[TokenizerDeclaration, str]:
    """tokenizer.json where the directory has one (transformers 5 saves only that), else spiece.model; checked."""
    extra = 0
    if inside(directory, "tokenizer.json").is_file():
        from toolkit.core.tokenizers import load_tokenizer_json

        path = directory / "tokenizer.json"
        tok = load_tokenizer_json(path, "save the model's tokenizer again (tokenizer.save_pretrained(DIR))")
        vocab = tok.get_vocab(with_added_tokens=True)
        source, note = "tokenizer.json", "T5Tokenizer (tokenizer.json, the tokenizers library)"
    elif inside(directory, "spiece.model").is_file():
        import sentencepiece as spm

        hf_files.sentencepiece(directory / "spiece.model", "a T5 directory holds T5Tokenizer's spiece.model")
        sp = spm.SentencePieceProcessor(model_proto=(directory / "spiece.model").read_bytes())
        vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
        # T5Tokenizer's sentinels, numbered after the pieces (its default: 100), each one id of the model's vocabulary
        extra = tok_config.get("extra_ids", 100)
        if type(extra) is not int or not 0 <= extra <= 1000:
            raise UsageError(f"{directory}/tokenizer_config.json: extra_ids must be a whole number from 0 to 1000, got {extra!r:.40}")
        vocab.update({f"<extra_id_{n}>": sp.get_piece_size() + extra - 1 - n for n in range(extra)})
        source, note = "spiece.model", "T5Tokenizer (spiece.model)"
    else:
        raise UsageError(f"{directory} has no tokenizer.json nor spiece.model; save the model's tokenizer beside it "
                         "(tokenizer.save_pretrained(DIR))")
    top = max(vocab.values(), default=0)
    if top >= settings.vocab_size:
        raise UsageError(f"{directory / source}: token id {top} is outside the model's vocabulary of {settings.vocab_size} "
                         "(config.json vocab_size)")
    for piece, want in (("<pad>", settings.pad_token_id), ("</s>", settings.eos_token_id)):
        if vocab.get(piece) != want:
            raise UsageError(f"{directory / source}: {piece} has id {vocab.get(piece)}, but config.json says {want}; "
                             "is it this model's tokenizer?")
    unk = vocab.get("<unk>")
    if unk is None:
        raise UsageError(f"{directory / source}: the tokenizer has no <unk> token")
    return TokenizerDeclaration(kind="t5", source=source, unk=unk, prefixes=prefixes, extra_ids=extra), note


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and the tokenizer files."""
    directory, config, generation, tok_config = read_configs(source, "model and tokenizer")
    settings, rules = settings_from(config, generation, directory)
    tokenizer, note = _tokenizer(directory, settings, task_prefixes(config, directory), tok_config)
    model_class = MODEL_CLASSES[settings.model_type]
    state, origin, files = hf_files.read_weights(directory, model_class)
    # Older checkpoints carry a relative bias for cross-attention that no T5 uses; transformers ignores it too.
    state.pop("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", None)
    if "shared.weight" not in state and "encoder.embed_tokens.weight" in state:  # saved under a tied name instead
        state["shared.weight"], origin["shared.weight"] = state["encoder.embed_tokens.weight"], origin["encoder.embed_tokens.weight"]
    own = meta_shapes(lambda: _hf_model(settings))
    decided_by_config = transformers_line() < 5
    # lm_head may be left out where it is the embedding (transformers 4: when the config ties it, 5: always)
    optional = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"} | (
        {"lm_head.weight"} if settings.tie_word_embeddings or not decided_by_config else set())
    check_weights(own, optional, state, origin, directory, model_class)
    if decided_by_config:
        if settings.tie_word_embeddings:  # transformers 4 keeps the embedding and drops an lm_head the weights hold
            state.pop("lm_head.weight", None)
    else:  # transformers 5 ties lm_head to the embedding unless the weights hold both and they differ (T5 v1.1, mT5)
        head = state.get("lm_head.weight")
        settings = replace(settings, tie_word_embeddings=head is None or torch.equal(head.float(), state["shared.weight"].float()))
    model = build(settings)
    model.hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    model.eval()
    return HfSource(directory, settings, rules, model, files, tokenizer, beams(config, generation), "t5", note)


MODEL = ModelEntry("t5", T5Settings, build, graphs)
