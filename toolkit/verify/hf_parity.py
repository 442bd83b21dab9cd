"""`tk verify` of a model imported from Hugging Face: tk's translations against transformers' own `generate`.

The other checks hold the graphs to tk's PyTorch view of the model (MarianForTk, M2M100ForTk: built from the same
modules). This one closes the loop with the implementation users know: transformers' own generate, greedy and with
the generation config's beam width (4 unless it says more), decoding the same sentences by the same rules (its
length penalty and early stopping, its maximum length, the forced end token, the forbidden tokens), must give the
same tokens as tk's decoding loop on every runtime session verified.

Where generate itself cannot run on the model, failing inside transformers (its cache sized by the encoder's layer
count on a T5 whose decoder has more, as T5-efficient's DL variants; 5.17's beam search on a Marian of two vocabulary
sizes), the reference does not exist, which says nothing about the graphs. verify then says so in one warning line,
naming the exception, and compares in its place what it can: tk's beam search over each session against the same
search over the PyTorch model (greedy already is, in the translation rows), on top of every graph against PyTorch's
forward. Those rows decide the exit code; --strict makes the missing reference a failure too, for a pipeline that must
not pass without it. A failure raised outside transformers is a failed row whatever --strict says.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import torch

from toolkit.core.decoding import pad_batch, translate_ids
from toolkit.core.errors import first_line
from toolkit.core.manifest import Manifest
from toolkit.core.variants import CATALOGUE
from toolkit.verify.report import Report, Row


def generate_tokens(model, src_ids: list[list[int]], m: Manifest, beam: int, out_len: int | None = None) -> list[list[int]]:
    """transformers' generate on the reference model, as each sentence's output tokens (start and end token dropped),
    at most `out_len` of them (None: the model's limit)."""
    rules = m.rules()
    out_len = out_len or m.max_output_len
    ids, lens = pad_batch(src_ids, rules.pad)
    mask = np.arange(ids.shape[1])[None, :] < lens[:, None]
    max_length = out_len + 1 + int(rules.forced_end)  # generate's counts the start token
    with torch.inference_mode():
        out = model.hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                                num_beams=beam, do_sample=False, max_length=max_length, length_penalty=rules.alpha,
                                early_stopping=rules.early_stopping, num_return_sequences=1,
                                # the directory's own rule, whatever the rebuilt config says (None: no forced end token)
                                forced_eos_token_id=rules.end if rules.forced_end else None,
                                # a multilingual model's target language, forced first as tk forces it
                                **({"forced_bos_token_id": rules.forced_first} if rules.forced_first is not None else {}))
    return [generated_tokens(row, rules.end) for row in out.tolist()]


def generated_tokens(row: list[int], end: int) -> list[int]:
    """One row of generate's output as the sentence's tokens: the decoder's start token dropped, cut before the first end
    token. generate pads a row only after its end token, so a row without one is all tokens: a pad id inside it is a
    token the model chose (T5's pad is its start token too), and dropping it made a tk translation that emitted it look
    different from generate's."""
    row = row[1:]
    return row[: row.index(end)] if end in row else row


def generate_parity(report: Report, m: Manifest, model, backends: dict, src_ids: list[list[int]], echo,
                    out_len: int | None = None, beams: tuple[int, ...] | None = None, strict: bool = False) -> None:
    """A row per (beam, session): how many translations are token-identical to generate's, both decoding at most
    `out_len` tokens (None: the model's limit), at `beams` (None: greedy and the generation config's beam width).
    Where generate cannot run, see `without_generate` (`strict`: its failure is a failed row)."""
    if not src_ids:
        return
    out_len = out_len or m.max_output_len
    rules = m.rules()
    options = (m.training.options if m.training else None) or {}
    beams = list(beams or (1, max(4, int(options.get("num_beams", 4)))))
    echo(f"comparing with transformers' generate: {len(src_ids)} sentences, " + " and ".join(
        "greedy" if b == 1 else f"beam {b}" for b in beams))
    failed: dict[int, BaseException] = {}
    for beam in beams:
        try:
            reference = generate_tokens(model, src_ids, m, beam, out_len)
        except (RuntimeError, ValueError, IndexError, TypeError) as e:
            failed[beam] = e
            continue
        for (provider, variant), backend in backends.items():
            hyps = translate_ids(backend(), src_ids, out_len, beam, rules.alpha, 1, None, False, rules)
            got = [h[0].tokens for h in hyps]
            same = sum(a == b for a, b in zip(reference, got))
            first = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), None)
            detail = f"{same}/{len(src_ids)} identical to generate(num_beams={beam})"
            if first is not None:
                detail += f"; sentence {first}: generate {reference[first][:8]}..., tk {got[first][:8]}..."
            report.rows.append(Row("generate", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences",
                                   "greedy tokens" if beam == 1 else f"beam {beam} tokens", outside=1 - same / len(src_ids),
                                   ok=same == len(src_ids) or not CATALOGUE[variant].exact_translation, detail=detail))
    if failed:
        without_generate(report, m, model, backends, src_ids, out_len, failed, strict)


def _named(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e, 120)}" if str(e).strip() else type(e).__name__


def raised_inside_transformers(e: BaseException) -> bool:
    """Whether transformers' own code raised `e`: of the traceback's frames in tk or in transformers, the last is
    transformers' (generate called from tk, failing in its cache; not an argument tk got wrong in its own code)."""
    import transformers

    roots = {"transformers": Path(transformers.__file__).resolve().parent, "tk": Path(__file__).resolve().parents[1]}
    last = None
    for frame in traceback.extract_tb(e.__traceback__):
        path = Path(frame.filename).resolve()
        last = next((name for name, root in roots.items() if path.is_relative_to(root)), last)
    return last == "transformers"


def without_generate(report: Report, m: Manifest, model, backends: dict, src_ids: list[list[int]], out_len: int,
                     failed: dict[int, BaseException], strict: bool) -> None:
    """generate failed at the beams of `failed`: tk's beam search over each session against the same search over the
    PyTorch model in its place, and one warning line saying so; a failed row per beam too when `strict`, or when the
    failure was raised outside transformers (then it is no reason to pass)."""
    import transformers

    from toolkit.pytorch.torch_backend import TorchBackend

    rules, specs = m.rules(), m.specs()
    torch_backend = TorchBackend(model, specs["encoder"], specs["decoder"])
    searched = [b for b in failed if b > 1]
    for beam in searched:  # greedy is compared with PyTorch's decode in the translation rows already
        want = [h[0].tokens for h in translate_ids(torch_backend, src_ids, out_len, beam, rules.alpha, 1, None, False, rules)]
        for (provider, variant), backend in backends.items():
            got = [h[0].tokens for h in translate_ids(backend(), src_ids, out_len, beam, rules.alpha, 1, None, False, rules)]
            same = sum(a == b for a, b in zip(want, got))
            report.rows.append(Row("translation", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences",
                                   f"beam {beam} tokens", outside=1 - same / len(src_ids),
                                   ok=same == len(src_ids) or not CATALOGUE[variant].exact_translation,
                                   detail=f"{same}/{len(src_ids)} identical to tk's beam search over PyTorch (generate cannot run)"))
    which = " and ".join("greedy" if b == 1 else f"beam {b}" for b in failed)
    whys = "; ".join(dict.fromkeys(_named(e) for e in failed.values()))
    inside = all(raised_inside_transformers(e) for e in failed.values())
    line = (f"transformers {transformers.__version__}'s generate cannot run on this model ({which}: {whys}"
            f"{', raised inside transformers' if inside else ''}), so tk's {which} tokens were not compared with generate's; "
            f"in its place verify held every graph to PyTorch's forward of the model (sweep and decode rows) and tk's {which} "
            f"tokens over the graphs to the same decode over PyTorch (translation rows)")
    report.warnings.append(line + ("" if strict or not inside else "; --strict makes this a failure"))
    if inside and not strict:
        return
    for beam, e in failed.items():
        report.rows.append(Row("generate", "encoder+decoder", "-", "-", f"{len(src_ids)} sentences",
                               "greedy tokens" if beam == 1 else f"beam {beam} tokens", outside=1.0, ok=False,
                               detail=f"not compared: transformers {transformers.__version__}'s generate(num_beams={beam}) "
                                      f"failed on this model ({_named(e)}"
                                      + ("); another transformers release may run it, or drop --strict" if inside
                                         else ", raised outside transformers)")))
