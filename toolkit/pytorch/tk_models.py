"""The builder of tk's own translation models (toolkit.core.entries.transformer and .seq2seq): their configs,
graphs, attention outputs and training presets, over the models in models/."""

from __future__ import annotations

from toolkit.core.graphs import FLOAT, SRC, GraphSpec, TensorSpec, decoder_graph, encoder_decoder_graphs
from toolkit.models.seq2seq import Seq2SeqAttention, Seq2SeqConfig
from toolkit.models.transformer import Transformer, TransformerConfig, layer_key
from toolkit.pytorch.registry import ModelEntry


def transformer_graphs(cfg: TransformerConfig) -> list[GraphSpec]:
    return encoder_decoder_graphs(cfg.num_hiddens, cfg.decoder_layers, cfg.num_heads, cfg.vocab_size)


def seq2seq_graphs(cfg: Seq2SeqConfig) -> list[GraphSpec]:
    memory = TensorSpec("memory", FLOAT, ("batch", "src_len", cfg.num_hiddens))
    state = TensorSpec("state", FLOAT, (cfg.num_layers, "batch", cfg.num_hiddens))
    encoder = GraphSpec("encoder", SRC, (memory, state))
    decoder = decoder_graph((state,), (memory,), cfg.vocab_size)
    return [encoder, decoder]


def transformer_attention(cfg: TransformerConfig) -> dict[str, tuple[TensorSpec, ...]]:
    """Encoder self-attention per layer over the source; per decoder step, each layer's self-attention
    over the target prefix (the cache plus the new position) and its cross-attention over the source."""
    h = cfg.num_heads
    encoder = tuple(TensorSpec(layer_key("encoder_attention", i), FLOAT, ("batch", h, "src_len", "src_len")) for i in range(cfg.num_layers))
    decoder = tuple(TensorSpec(layer_key(n, i), FLOAT, ("batch", h, k)) for i in range(cfg.decoder_layers)
                    for n, k in (("self_attention", "past_len+1"), ("cross_attention", "src_len")))
    return {"encoder": encoder, "decoder": decoder}


def read_transformer_attention(model: Transformer, graph: str, batch: int) -> list:
    if graph == "encoder":
        return list(model.encoder_attention_weights)
    return [att.attention.attention_weights.reshape(batch, model.cfg.num_heads, -1) for block in model.decoder_blocks
            for att in (block.self_attention, block.cross_attention)]


def seq2seq_attention(cfg: Seq2SeqConfig) -> dict[str, tuple[TensorSpec, ...]]:
    """Bahdanau attention of each decoder step over the source."""
    return {"encoder": (), "decoder": (TensorSpec("cross_attention", FLOAT, ("batch", "src_len")),)}


def read_seq2seq_attention(model: Seq2SeqAttention, graph: str, batch: int) -> list:
    return [] if graph == "encoder" else [model.decoder.attention.attention_weights.reshape(batch, -1)]


MODELS = {
    # The encoder-decoder Transformer (post-LN; --pre-ln for pre-LN): the paper's schedule, its last epochs averaged;
    # the student preset (toolkit.pytorch.train.PRESETS) is its recipe alone.
    "transformer": ModelEntry("transformer", TransformerConfig, Transformer, transformer_graphs, train="translation",
                              attention=transformer_attention, read_attention=read_transformer_attention,
                              presets={"base": dict(epochs=30, average_last=5)}, recipes=("student",)),
    # GRU encoder + Bahdanau-attention GRU decoder: its rate halved when validation loss stalls, stopped early.
    "seq2seq": ModelEntry("seq2seq", Seq2SeqConfig, Seq2SeqAttention, seq2seq_graphs, train="translation",
                          attention=seq2seq_attention, read_attention=read_seq2seq_attention,
                          presets={"base": dict(num_hiddens=224, embed_size=224, num_layers=2, tie_embeddings=True,
                                                dropout=0.2, epochs=30, lr=1e-3, warmup=500, schedule="plateau", patience=3)}),
}
