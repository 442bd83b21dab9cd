"""`tk verify DIR --to-hf HF`: the MarianMTModel directory that `tk export DIR --to-hf HF` wrote, held to tk's graphs.

transformers loads HF with MarianMTModel.from_pretrained and AutoTokenizer.from_pretrained, as a user would, and four
kinds of evidence are compared with tk's fp32 graphs of DIR on ONNX Runtime (CPU):

  static     config.json and generation_config.json say what tk's model is (sizes, scaled embeddings, ReLU, tied
             embeddings, the start, end and pad tokens, no forced end token, the output limit, greedy);
  sweep      log-probabilities of every target position, teacher-forced, at several (batch, source length, target
             length) shapes, padded batches among them, random tokens; each against the graphs' step-by-step
             log-probabilities, within fp32's tolerance (or --atol/--rtol);
  tokenizer  AutoTokenizer's ids are tk's on held-out sentences (no end token on the source), and its decoding of
             tk's translations is tk's text; on NORMALIZATION_TEXTS (whitespace runs and kinds, NFKC's fullwidth
             forms and ligatures, decomposed accents, emoji, empty text) AutoTokenizer's ids are tk's, one row per
             text, and MarianTokenizer's (Marian's spm files, which skip tk's normalization) are tk's on the text
             tk's normalize gives;
  generate   generate's greedy tokens (the directory's generation config) are tk's greedy tokens on the same
             sentences; a sentence may part only at a near-tie (the two tokens within twice the tolerance on the
             graphs), which the two engines' rounding may break either way.
torch and transformers are imported when it runs: `tk export --to-hf` (toolkit.convert.to_hf) needs neither.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from toolkit.convert import to_hf
from toolkit.core import manifest as manifest_mod
from toolkit.core.decoding import greedy
from toolkit.core.errors import UsageError, first_line
from toolkit.core.manifest import Manifest
from toolkit.verify.report import Report, Row

# (batch, source length, target length): one token each, a padded batch, the longest source (every position of the
# encoder's table), padded rows of length 1, the longest target (every position of the decoder's table).
SHAPES = ((1, 1, 1), (3, 9, 4), (4, 64, 8), (5, 20, 12), (2, 7, 64))
GRAPH = "MarianMTModel"
PROVIDER = "transformers"


def verify_hf(model_dir: str | Path, hf_dir: str | Path, atol: float | None = None, rtol: float | None = None, seed: int = 0,
              sentences: int = 16, data: str | Path | None = None, echo=print) -> Report:
    import transformers

    from toolkit.verify.checks import held_out_sentences
    from toolkit.verify.compare import tolerance

    m = manifest_mod.load(model_dir)
    to_hf.mappable(m)
    m.check_files()
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise UsageError(f"--to-hf {hf_dir} does not exist; write it with `tk export {model_dir} --to-hf {hf_dir}`")
    if not to_hf.is_hf_directory(hf_dir):
        raise UsageError(f"--to-hf {hf_dir} is not a Hugging Face MarianMTModel directory (no marian config.json)")
    report = Report(str(model_dir), seed, runtime=f"transformers {transformers.__version__}")
    report.reference = f"tk's fp32 graphs of {model_dir} on ONNX Runtime (CPU)"
    report.reference_kind = "graphs"
    report.reference_proves = (f"transformers' MarianMTModel and tokenizers from {hf_dir} compute what tk's exported graphs and "
                               "tokenizer compute (log-probabilities, tokens, ids on text that exercises tk's normalization, and "
                               "text); it says nothing of the weights' provenance")
    tol = tolerance("fp32", atol, rtol)
    other = _other_sizes(m, hf_dir)
    if other:  # another model's directory: nothing of it can be compared with these graphs (its ids index other tables)
        report.rows.append(Row("static", GRAPH, "fp32", PROVIDER, "-", "sizes", ok=False,
                               detail=f"{hf_dir} does not match {model_dir}: {other}; give the directory that "
                                      f"`tk export {model_dir} --to-hf DIR` wrote"))
        return report
    _static(report, m, hf_dir)
    try:
        from transformers import AutoTokenizer, MarianMTModel
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" bars: this command prints its own lines
        model = MarianMTModel.from_pretrained(hf_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    except Exception as e:  # a directory transformers cannot load is the verdict, not a crash
        report.rows.append(Row("static", GRAPH, "fp32", PROVIDER, "-", "from_pretrained", ok=False, detail=first_line(e)))
        return report
    from toolkit.runtimes import DEFAULT_RUNTIME, load

    backend = load(m, DEFAULT_RUNTIME, "cpu", "fp32").backend
    echo(f"comparing {hf_dir} (transformers {transformers.__version__}) with {model_dir}'s fp32 graphs (ONNX Runtime, CPU)")
    _sweep(report, m, model, backend(), seed, tol)
    normalization_rows(report, m, hf_dir, tokenizer)
    english, origin = held_out_sentences(sentences, data)
    if english:
        echo(f"tokenizing and translating {len(english)} sentences from the {origin}, greedy")
        _generate(report, m, model, tokenizer, backend(), english, tol)
    return report


# The config.json keys that fix the shapes of a MarianMTModel's tensors.
SIZES = ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
         "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")


def _other_sizes(m: Manifest, hf_dir: Path) -> str | None:
    """Which size of HF's configuration (as transformers reads it, defaults included) is not the model's (say
    "vocab_size 524, the model's 6000"), or None; a config transformers cannot read is left to the static check and
    from_pretrained, which name it."""
    from transformers import MarianConfig

    try:
        got = MarianConfig.from_pretrained(hf_dir).to_dict()
    except Exception:  # noqa: BLE001 - reported by the checks that follow
        return None
    want = to_hf.marian_config(m.config)
    key = next((k for k in SIZES if got.get(k) != want[k]), None)
    return None if key is None else f"its config gives {key} {str(got.get(key))[:20]}, the model's is {want[key]}"


def _static(report: Report, m: Manifest, hf_dir: Path) -> None:
    """The configuration files hold what tk writes for this model (a missing or changed value is named)."""
    for name, want in (("config.json", to_hf.marian_config(m.config)), ("generation_config.json", to_hf.generation_config(m))):
        try:
            got = json.loads((hf_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            report.rows.append(Row("static", GRAPH, "fp32", PROVIDER, "-", name, ok=False, detail=f"unreadable: {first_line(e)}"))
            continue
        wrong = [k for k, v in want.items() if not isinstance(got, dict) or got.get(k, "(missing)") != v]
        detail = "; ".join(f"{k}: {got.get(k, '(missing)') if isinstance(got, dict) else '?'!r}, expected {want[k]!r}" for k in wrong[:3])
        report.rows.append(Row("static", GRAPH, "fp32", PROVIDER, "-", name, outside=len(wrong) / len(want), ok=not wrong, detail=detail))


def _sweep(report: Report, m: Manifest, model, backend, seed: int, tol: tuple[float, float]) -> None:
    """Teacher-forced log-probabilities at every SHAPES case: the graphs one step at a time, transformers in one pass."""
    import torch

    from toolkit.verify.compare import compare, top1

    rules, vocab, max_len = m.rules(), m.config["vocab_size"], m.max_len
    rng = np.random.default_rng(seed)
    for b, s, t in SHAPES:
        s, t = min(s, max_len), min(t, max_len)
        lens = rng.integers(1, s + 1, b)
        lens[0] = s
        if b > 2:
            lens[-1] = 1
        src = rng.integers(4, vocab, (b, s))
        mask = np.arange(s)[None, :] < lens[:, None]
        src[~mask] = rules.pad
        tgt = np.concatenate([np.full((b, 1), rules.start), rng.integers(4, vocab, (b, t - 1))], axis=1)
        state = backend.encode(src.astype(np.int64), lens.astype(np.int64))
        ref = []
        for k in range(t):
            lp, state = backend.step(tgt[:, k].astype(np.int64), state)
            ref.append(lp)
        ref = np.stack(ref, axis=1)
        with torch.inference_mode():
            logits = model(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                           decoder_input_ids=torch.from_numpy(tgt)).logits
        got = torch.log_softmax(logits.float(), dim=-1).numpy()
        stats = compare(ref, got, *tol)
        case = f"batch={b} src_len={s} tgt_len={t}" + (f" (lengths {', '.join(map(str, lens))})" if b > 1 else "")
        row = Row("sweep", GRAPH, "fp32", PROVIDER, case, "log_probs", **stats)
        if ref.shape == got.shape:
            row.top1 = top1(ref, got)
        report.rows.append(row)


NORMALIZATION_FAST = "normalization ids (AutoTokenizer)"
NORMALIZATION_SLOW = "normalization ids (MarianTokenizer, tk-normalized text)"


def normalization_rows(report: Report, m: Manifest, hf_dir: Path, tokenizer) -> None:
    """tk's ids against the directory's tokenizers on NORMALIZATION_TEXTS, one row per text and tokenizer (a failing
    row names the text and both id lists): AutoTokenizer (`tokenizer`, from tokenizer.json) on the text as it is, and,
    where the directory holds Marian's spm files, MarianTokenizer (add_special_tokens=False) on the text tk's
    normalize gives, since MarianTokenizer has no NFKC or whitespace step of its own (docs/models.md says so)."""
    from toolkit.core.tokenizer import normalize
    from toolkit.core.tokenizers import open_tokenizer

    labels, texts = zip(*to_hf.NORMALIZATION_TEXTS)
    want = open_tokenizer(m).encode(list(texts))
    _compare_ids(report, NORMALIZATION_FAST, "AutoTokenizer", labels, texts, want, lambda: tokenizer(list(texts))["input_ids"])
    if not (hf_dir / "source.spm").is_file():
        return
    try:
        from transformers import MarianTokenizer

        with warnings.catch_warnings():  # "Recommended: pip install sacremoses": tk's ids are compared without it
            warnings.simplefilter("ignore")
            slow = MarianTokenizer.from_pretrained(hf_dir)
    except Exception as e:  # noqa: BLE001 - spm files transformers cannot load are the verdict, not a crash
        report.rows.append(Row("tokenizer", GRAPH, "fp32", PROVIDER, "-", NORMALIZATION_SLOW, ok=False,
                               detail=f"MarianTokenizer.from_pretrained: {first_line(e)}"))
        return
    normalized = [normalize(t) for t in texts]
    _compare_ids(report, NORMALIZATION_SLOW, "MarianTokenizer", labels, texts, want,
                 lambda: slow(normalized, add_special_tokens=False)["input_ids"])


def _compare_ids(report: Report, output: str, name: str, labels, texts, want: list[list[int]], encode) -> None:
    """One row per text: `encode()`'s ids (all texts at once) against tk's `want`; a tokenizer that raises fails
    every text with its message."""
    error = ""
    try:
        got = encode()
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot encode is the verdict, not a crash
        got, error = [None] * len(texts), first_line(e)
    for label, text, a, b in zip(labels, texts, want, got):
        same = a == b
        detail = "" if same else (f"{_shown(text)}: tk {len(a)} ids {a[:8]}, " +
                                  (f"{name} failed: {error}" if b is None else f"{name} {len(b)} ids {b[:8]}"))
        report.rows.append(Row("tokenizer", GRAPH, "fp32", PROVIDER, label, output, outside=float(not same), ok=same, detail=detail))


def _shown(text: str, limit: int = 40) -> str:
    """The text on one line: repr escapes tabs, newlines and no-break spaces; a long text is cut."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def _generate(report: Report, m: Manifest, model, tokenizer, backend, english: list[str], tol: tuple[float, float]) -> None:
    """AutoTokenizer's ids and text against tk's tokenizer, then generate's greedy tokens against tk's greedy loop."""
    import torch

    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.verify.checks import prefix_log_probs
    from toolkit.verify.hf_parity import generated_tokens

    rules, n = m.rules(), len(english)
    tk_tok = open_tokenizer(m)
    want = tk_tok.encode(english)
    got = tokenizer(english)["input_ids"]
    same = sum(a == b for a, b in zip(want, got))
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    report.rows.append(Row("tokenizer", GRAPH, "fp32", PROVIDER, f"{n} sentences", "ids", outside=1 - same / n, ok=same == n,
                           detail=f"{same}/{n} identical to tk's" + ("" if first is None else f"; sentence {first}: tk {want[first][:8]}..., "
                                                                    f"AutoTokenizer {got[first][:8]}...")))
    src = [ids[: m.max_len] for ids in want]
    tk_tokens = [h.tokens for h in greedy(backend, src, m.max_output_len, rules=rules)]
    texts = tk_tok.decode(tk_tokens)
    decoded = tokenizer.batch_decode(tk_tokens, skip_special_tokens=True)
    same = sum(a == b for a, b in zip(texts, decoded))
    report.rows.append(Row("tokenizer", GRAPH, "fp32", PROVIDER, f"{n} sentences", "text", outside=1 - same / n, ok=same == n,
                           detail=f"{same}/{n} of tk's translations decoded to tk's text"))
    hf_tokens: list[list[int]] = []
    with torch.inference_mode():
        for i in range(0, n, 64):
            batch = tokenizer(english[i : i + 64], return_tensors="pt", padding=True, truncation=True)
            hf_tokens += [generated_tokens(row, rules.end) for row in model.generate(**batch).tolist()]
    same = sum(a == b for a, b in zip(tk_tokens, hf_tokens))
    detail, ties, real = f"{same}/{n} identical to tk's greedy", 0, 0
    for i, (a, b) in enumerate(zip(tk_tokens, hf_tokens)):
        if a == b:
            continue
        step = next(k for k, (x, y) in enumerate(zip([*a, rules.end], [*b, rules.end])) if x != y)
        lp = prefix_log_probs(backend, src[i], a[:step], rules)
        pick = [t[step] if step < len(t) else rules.end for t in (a, b)]
        margin = float(lp[pick[0]] - lp[pick[1]])
        tie = abs(margin) <= 2 * tol[0]  # a tie the two engines' rounding may break either way
        ties, real = ties + tie, real + (not tie)
        if (tie and ties == 1) or (not tie and real == 1):  # the first of each kind
            detail += (f"; sentence {i} first differs at step {step}: tk {pick[0]}, generate {pick[1]} "
                       f"(graphs' margin {margin:.2e}: {'a near-tie' if tie else 'a real divergence'})")
    report.rows.append(Row("generate", GRAPH, "fp32", PROVIDER, f"{n} sentences", "greedy tokens", outside=1 - same / n,
                           ok=n - same == ties, detail=detail))
