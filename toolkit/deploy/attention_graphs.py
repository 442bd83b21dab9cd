"""The attention variant: the fp32 graphs with their attention probabilities as extra outputs.

Built in memory from the fp32 graphs, like the precision variants, so the shipped directories
need no extra files and the fp32 graphs stay as they are: each attention's Softmax (followed by
its mask multiply, where the attention has a mask) becomes a graph output, reshaped to the shape
the registry declares. Which outputs, in which order, is declared once in the registry and
recorded in manifest.json under "attention"; `tk verify` checks them against PyTorch's weights.

Torch-free: `tk attention` runs on the deploy path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolkit.core import architectures
from toolkit.core.errors import ToolkitError, UsageError
from toolkit.core.graphs import GraphSpec, TensorSpec, with_outputs
from toolkit.core.manifest import Manifest


def declared(m: Manifest) -> dict[str, tuple[TensorSpec, ...]]:
    """Graph name -> the attention outputs the manifest declares for it."""
    att = m.attention
    if att is None:
        raise UsageError(f"{m.directory}/manifest.json declares no attention outputs (exported before tk had them); "
                         f"add them with `tk export {m.directory} --attention`")
    return {g: tuple(TensorSpec(t["name"], t["dtype"], tuple(t["dims"]), t.get("fill", "normal")) for t in ts) for g, ts in att.items()}


def specs(m: Manifest) -> dict[str, GraphSpec]:
    """The attention variant's declarations: each graph's outputs followed by its attention outputs."""
    extra = declared(m)
    return {name: with_outputs(spec, extra.get(name, ())) for name, spec in m.specs().items()}


def expose(model, extra: tuple[TensorSpec, ...]) -> None:
    """Adds `extra` as outputs of the onnx.ModelProto `model`, in place.

    The k-th Softmax node in graph order is the k-th declared output (the registry declares them
    in the order the model computes them); where the Softmax feeds a Mul, that is the mask, and
    the output is taken after it, so masked keys read exactly zero as they do in PyTorch. The
    internal (batch * heads, queries, keys) tensor is reshaped to the declared dims; a per-step
    decoder output drops its single query axis.
    """
    from onnx import TensorProto, helper

    graph = model.graph
    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    if len(softmax) != len(extra):
        raise ToolkitError(f"graph '{graph.name}' has {len(softmax)} Softmax nodes but {len(extra)} attention outputs are declared; "
                           "re-export the model directory")
    users: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    for k, (node, t) in enumerate(zip(softmax, extra)):
        probs = node.output[0]
        after = users.get(probs, [])
        if len(after) == 1 and after[0].op_type == "Mul":
            probs = after[0].output[0]
        heads = t.dims[1] if len(t.dims) > 1 and isinstance(t.dims[1], int) else None
        keep_query = len(t.dims) == 3 + (heads is not None)  # encoder self-attention keeps its query axis
        lead = [-1] + ([heads] if heads is not None else [])
        pre = f"attention_output_{k}"
        graph.node.extend([
            helper.make_node("Shape", [probs], [f"{pre}_tail"], start=1 if keep_query else 2, end=3),
            helper.make_node("Constant", [], [f"{pre}_lead"], value=helper.make_tensor(f"{pre}_lead_value", TensorProto.INT64,
                                                                                        [len(lead)], lead)),
            helper.make_node("Concat", [f"{pre}_lead", f"{pre}_tail"], [f"{pre}_shape"], axis=0),
            helper.make_node("Reshape", [probs, f"{pre}_shape"], [t.name]),
        ])
        graph.output.append(helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)))


@functools.lru_cache(maxsize=8)
def _built(path: str, digest: str, extra: tuple[TensorSpec, ...]) -> bytes:
    # Keyed by the fp32 graph's sha256 as well as its path, so a re-exported graph is rebuilt.
    import onnx

    model = onnx.load(path)  # with its external weights: the bytes must be self-contained
    expose(model, extra)
    return model.SerializeToString()


def graph_source(m: Manifest, graph: str) -> Path | bytes:
    """The attention variant of one graph: the fp32 file where it declares no attention, else built in memory."""
    extra = declared(m).get(graph, ())
    if not extra:
        return m.graph_path(graph)
    return _built(str(m.graph_path(graph)), m.graphs[graph].sha256, extra)


def load_sessions(m: Manifest, provider: str = "cpu", **options) -> dict:
    """ONNX Runtime sessions of the attention variant, one per graph."""
    from toolkit.runtimes.onnxruntime.sessions import create_session

    return {name: create_session(graph_source(m, name), provider, **options) for name in m.graphs}


# ---- decoding with the attention recorded --------------------------------------------------------

def recorder(sessions: dict, specs: dict[str, GraphSpec], extra: dict[str, tuple[TensorSpec, ...]]):
    """An OrtBackend over the attention graphs that keeps each call's attention weights on the host."""
    from toolkit.runtimes.onnxruntime.backend import OrtBackend

    class AttentionRecorder(OrtBackend):
        def __init__(self):
            super().__init__(sessions["encoder"], sessions["decoder"], specs["encoder"], specs["decoder"])
            self.encoder_names = [t.name for t in extra.get("encoder", ())]
            self.recorded = tuple(t.name for t in extra.get("decoder", ()))
            self.encoded: dict[str, np.ndarray] = {}
            self.steps: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []  # (sentence of each row, outputs)
            self.rows = np.zeros(0, dtype=np.int64)

        def record(self, graph: str, outputs: dict) -> None:
            if graph == "encoder":
                self.encoded = {n: outputs[n] for n in self.encoder_names}
                self.rows, self.steps = np.arange(len(outputs["src"])), []
            else:
                self.steps.append((self.rows.copy(), outputs))

        def select(self, state, rows):
            # Finished sentences leave the batch: keep track of which sentence each row still is.
            self.rows = self.rows[rows]
            return super().select(state, rows)

    return AttentionRecorder()


@dataclass
class Attention:
    """One translated sentence and the attention weights of its translation, trimmed to its own tokens."""

    model: str
    sentence: str
    translation: str
    source: list[str]  # source pieces (the keys of encoder and cross-attention)
    target: list[str]  # output pieces, the end-of-sentence token included (one decoder step each)
    target_inputs: list[str]  # decoder inputs: <s> then the output pieces (the keys of decoder self-attention)
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # name -> ([heads,] queries, keys)

    def to_json(self) -> dict:
        return {"model": self.model, "sentence": self.sentence, "translation": self.translation, "source": self.source,
                "target": self.target, "target_inputs": self.target_inputs,
                "weights": {n: np.round(w.astype(np.float64), 6).tolist() for n, w in self.weights.items()},
                "shapes": {n: list(w.shape) for n, w in self.weights.items()}}


def alignment(att: Attention) -> list[tuple[str, str, float]]:
    """For each output piece, the source piece with the most cross-attention (the last layer's,
    averaged over heads), as OpenNMT's -attn_debug prints it: (output piece, source piece, weight)."""
    layer = lambda n: int(n.rsplit("_", 1)[1]) if n != "cross_attention" else 0  # noqa: E731 (the GRU has one, unnumbered)
    w = att.weights[max((n for n in att.weights if n.startswith("cross_attention")), key=layer)]
    w = w.mean(0) if w.ndim == 3 else w
    return [(piece, att.source[int(row.argmax())], float(row.max())) for piece, row in zip(att.target, w)]


def gather(rec, specs: dict[str, GraphSpec], sentence: int, src_len: int, steps: int) -> dict[str, np.ndarray]:
    """Sentence `sentence`'s weights out of the batch, one decoder step per output token:
    decoder outputs become ([heads,] steps, keys), keys padded with zeros past each step's own."""
    out = {n: w[sentence][..., :src_len, :src_len] for n, w in rec.encoded.items()}
    dims = {t.name: t.dims for t in specs["decoder"].outputs}
    for name in rec.recorded:
        per_step = [outputs[name][int(np.flatnonzero(rows == sentence)[0])] for rows, outputs in rec.steps[:steps]
                    if sentence in rows]
        keys = src_len if dims[name][-1] == "src_len" else len(per_step)
        grid = np.zeros((*per_step[0].shape[:-1], len(per_step), keys), np.float32)
        for t, w in enumerate(per_step):
            n = min(w.shape[-1], keys)
            grid[..., t, :n] = w[..., :n]
        out[name] = grid
    return out


def training_points(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The kernel regression's keys and values from train_points.npz, as float32 arrays. Never unpickled (allow_pickle
    False: an object array's pickle would run code), and whatever else is wrong with the file is one line."""
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as f:
            x, y = f["x"], f["y"]
    except ValueError as e:
        why = ("it holds an object array, which tk does not load (that would unpickle, which runs code)"
               if "allow_pickle" in str(e) else f"it is not a valid .npz ({str(e)[:80]})")
        raise UsageError(f"{path}: {why}; re-export the nw checkpoint") from None
    except (KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise UsageError(f"{path} is not a valid train_points.npz ({type(e).__name__}: {str(e)[:80]}); "
                         "re-export the nw checkpoint") from None
    if x.dtype.kind not in "fiu" or y.dtype.kind not in "fiu" or x.shape != y.shape or x.ndim != 1:
        raise UsageError(f"{path} holds arrays of {x.dtype} {x.shape} and {y.dtype} {y.shape}, not two equal-length numeric "
                         "vectors x and y; re-export the nw checkpoint")
    return x.astype(np.float32), y.astype(np.float32)


def translate(directory: str | Path, sentences: list[str], provider: str = "cpu") -> list[Attention]:
    """Greedy translations with the attention graphs, through the one decoding loop, with their weights."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.core.decoding import greedy
    from toolkit.core.tokenizer import Tokenizer

    m = manifest_mod.load(directory)
    if m.kind != architectures.SEQ2SEQ or m.tokenizer_path() is None:
        raise UsageError(f"{directory} is not a trained translation model; use exported/transformer or exported/seq2seq")
    if not sentences or not all(s.strip() for s in sentences):
        raise UsageError("give a non-empty English sentence to translate, e.g. tk attention exported/transformer \"I'm home.\"")
    for sentence in sentences:
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (Python keeps them as lone surrogates)
            raise UsageError("the sentence is not valid UTF-8 text; pass it as UTF-8") from None
    m.check_files()
    tokenizer = Tokenizer.load(m.tokenizer_path())
    att_specs = specs(m)
    rec = recorder(load_sessions(m, provider), att_specs, declared(m))
    src_ids = tokenizer.encode(sentences)
    longest = max(len(ids) for ids in src_ids)
    if longest > m.max_len:
        # Drawn truncated, the picture would show attention over a sentence the user did not give.
        raise UsageError(f"the sentence is {longest} subwords long and the model reads at most {m.max_len}; give a shorter one")
    hyps = greedy(rec, src_ids, m.max_len)
    piece = tokenizer.sp.id_to_piece
    results = []
    for i, (text, ids, hyp) in enumerate(zip(sentences, src_ids, hyps)):
        ended = len(hyp.tokens) < m.max_len  # else it stopped at the length limit, with no end-of-sentence step
        steps = len(hyp.tokens) + (1 if ended else 0)
        target = [piece(t) for t in hyp.tokens] + (["</s>"] if ended else [])
        results.append(Attention(m.model, text, tokenizer.decode([hyp.tokens])[0], [piece(t) for t in ids], target,
                                 ["<s>", *target[:-1]], gather(rec, att_specs, i, max(len(ids), 1), steps)))
    return results


# ---- Nadaraya-Watson -----------------------------------------------------------------------------

def nadaraya_watson(directory: str | Path, step: float = 0.1) -> dict[str, np.ndarray]:
    """The kernel regression's test-grid predictions and attention weights over the training inputs,
    from the exported graph: with the learned width, and (queries and keys divided by that width,
    which cancels it) as the non-parametric estimator with width 1."""
    import onnx

    from toolkit.core import manifest as manifest_mod
    from toolkit.runtimes.onnxruntime.sessions import create_session

    m = manifest_mod.load(directory)
    if architectures.get(m.model).figure != "kernel":
        raise UsageError(f"{directory} holds a '{m.model}' model, not the kernel regression; use exported/nw")
    m.check_files()
    points = m.directory / "train_points.npz"
    if not points.is_file():
        raise UsageError(f"{directory} has no train_points.npz (exported with --random-init); export the trained nw checkpoint")
    x_train, y_train = training_points(points)
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(m.graph_path("model")).graph.initializer}
    w = float(np.asarray(weights.get("model.w", 1.0)).reshape(-1)[0])
    session = create_session(m.graph_path("model"))
    x_test = np.arange(0, 5, step, dtype=np.float32)
    keys, values = np.tile(x_train, (len(x_test), 1)), np.tile(y_train, (len(x_test), 1))
    learned, learned_w = session.run(None, {"queries": x_test, "keys": keys, "values": values})
    plain, plain_w = session.run(None, {"queries": x_test / w, "keys": keys / w, "values": values})
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "truth": 2 * np.sin(x_test) + x_test ** 0.8,
            "learned": learned, "learned_weights": learned_w, "nonparametric": plain, "nonparametric_weights": plain_w,
            "w": np.float32(w)}
