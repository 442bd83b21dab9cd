"""tk translate: nothing dropped, reordered or duplicated; batching never changes a translation."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.core import data
from toolkit.core.batching import DecodeOptions, decode_ids
from toolkit.core.decoding import beam_search, greedy
from toolkit.deploy.translate import open_model


@pytest.fixture(scope="module")
def english(corpus_zip) -> list[str]:
    en, _ = data.references(data.load_corpus(corpus_zip).splits["test"])
    return en[:40]


@pytest.fixture(scope="module")
def model(tiny_export):
    return open_model(tiny_export, "cpu")


def test_file_order_and_line_count_are_preserved(cli, tiny_export, english, tmp_path):
    lines = english[:30] + ["", "", "Go."]
    random.Random(0).shuffle(lines)  # lengths in no order, empty lines among them
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = cli("translate", "--model", tiny_export, "-i", src, "-o", out, "--batch-size", 7)
    assert result.exit_code == 0, result.output
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == len(lines)
    # Each line is that sentence's own translation, one at a time: order restored, no mixing.
    one_by_one = cli("translate", "--model", tiny_export, "-q", "--batch-size", 1, *[s for s in lines if s])
    expected = iter(one_by_one.output.splitlines())
    for source, translation in zip(lines, got):
        assert translation == ("" if not source else next(expected))


def test_batched_output_equals_one_sentence_at_a_time(model, english):
    ids = model.tokenizer.encode(english)
    backend = model.backend()
    batched = decode_ids(backend, ids, DecodeOptions.bare(batch_size=64, max_len=model.manifest.max_len))
    single = decode_ids(backend, ids, DecodeOptions.bare(batch_size=1, max_len=model.manifest.max_len))
    assert [h[0].tokens for h in batched] == [h[0].tokens for h in single]


@pytest.mark.slow
def test_torch_and_onnxruntime_backends_give_the_same_greedy_output(model, english, tiny_export):
    from toolkit.pytorch.reference import load_reference
    from toolkit.pytorch.torch_backend import TorchBackend

    _, _, torch_model, _ = load_reference(model.manifest)
    specs = model.manifest.specs()
    ids = model.tokenizer.encode(english)
    ref = greedy(TorchBackend(torch_model, specs["encoder"], specs["decoder"]), ids, model.manifest.max_len)
    got = greedy(model.backend(), ids, model.manifest.max_len)
    assert [h.tokens for h in ref] == [h.tokens for h in got]


def test_beam_one_is_greedy(model, english):
    ids = model.tokenizer.encode(english)
    backend = model.backend()
    g = greedy(backend, ids, model.manifest.max_len)
    b = beam_search(backend, ids, model.manifest.max_len, beam=1)
    assert [h.tokens for h in g] == [h[0].tokens for h in b]
    assert [round(h.score, 4) for h in g] == [round(h[0].score, 4) for h in b]


def forced_score(backend, src: list[int], tokens: list[int], ended: bool) -> float:
    """The model's log-probability of `tokens` (then end of sentence, if the hypothesis ended), step by step."""
    import numpy as np

    from toolkit.core.decoding import pad_batch
    from toolkit.core.tokenizer import BOS, EOS

    state = backend.encode(*pad_batch([src]))
    total, previous = 0.0, BOS
    for token in [*tokens, *([EOS] if ended else [])]:
        log_probs, state = backend.step(np.array([previous]), state)
        total += float(log_probs[0, token])
        previous = token
    return total


def test_beam_search_returns_its_hypotheses_best_first_with_the_models_own_scores(model, english):
    """What beam search guarantees on any model and any CPU (it does not guarantee beating greedy: greedy's
    path can leave the beam): its n-best come best first, and each score is the model's log-probability of
    that output. The exact search itself is held to an exhaustive search in test_beam_search.py."""
    ids = model.tokenizer.encode(english[:12])
    backend = model.backend()
    limit = model.manifest.max_len
    for alpha in (0.0, 0.6):
        results = beam_search(backend, ids, limit, beam=4, alpha=alpha, n_best=4)
        for src, hyps in zip(ids, results):
            normalized = [h.normalized(alpha) for h in hyps]
            assert normalized == sorted(normalized, reverse=True)
            for h in hyps:
                ended = len(h.tokens) < limit
                assert h.score == pytest.approx(forced_score(backend, src, h.tokens, ended), abs=1e-3)


def textbook_beam(backend, src: list[int], max_len: int, beam: int, alpha: float) -> list:
    """The oracle: one sentence, every (hypothesis, token) pair ranked on the host at every step."""
    import numpy as np

    from toolkit.core.decoding import Hypothesis, pad_batch
    from toolkit.core.tokenizer import BOS, EOS

    state = backend.encode(*pad_batch([src]))
    live, done, token = [Hypothesis([], 0.0)], [], np.array([BOS])
    for step in range(max_len):
        log_probs, state = backend.step(token, state)
        scores = np.array([h.score for h in live])[:, None] + log_probs
        new = []
        for idx in np.argsort(-scores.ravel(), kind="stable")[: 2 * beam]:
            parent, tok = divmod(int(idx), scores.shape[1])
            hyp = Hypothesis(live[parent].tokens + ([] if tok == EOS else [tok]), float(scores[parent, tok]))
            (done if tok == EOS or step == max_len - 1 else new).append((parent, tok, hyp))
            if len(done) >= beam or len(new) == beam:
                break
        if len(done) >= beam or not new:
            break
        live = [h for *_, h in new]
        state = backend.select(state, np.array([p for p, *_ in new]))
        token = np.array([t for _, t, _ in new])
    return sorted([h for *_, h in done] or live, key=lambda h: -h.normalized(alpha))


def test_batched_beam_search_equals_the_textbook_one_sentence_search(model, english):
    """tk's beam search is batched over sentences and ranks only each row's 2*beam best tokens, found by a
    TopK graph on the decoder's device; it must find exactly what the exhaustive host-side search finds."""
    import numpy as np

    from toolkit.core.decoding import top_k_rows

    ids = [s for s in model.tokenizer.encode(english[:16]) if s]
    backend, max_len = model.backend(), model.manifest.max_len
    batched = beam_search(backend, ids, max_len, beam=4, alpha=0.6, n_best=4)
    for src, got in zip(ids, batched):
        want = textbook_beam(backend, src, max_len, beam=4, alpha=0.6)[:4]
        assert [h.tokens for h in got] == [h.tokens for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=1e-5)

    log_probs = np.log(np.random.default_rng(0).dirichlet(np.ones(500), size=7)).astype(np.float32)
    values, indices = top_k_rows(log_probs, 8)  # the fallback for backends without their own ranking
    assert (np.diff(values, axis=1) <= 0).all() and (np.take_along_axis(log_probs, indices, 1) == values).all()
    assert (values[:, -1:] >= np.sort(log_probs, axis=1)[:, -9:-8]).all()  # nothing better was left out


def test_n_best_prints_n_scored_hypotheses_per_line(cli, tiny_export):
    result = cli("translate", "--model", tiny_export, "-q", "--beam", 4, "--n-best", 3, "I lost.", "Go.")
    assert result.exit_code == 0, result.output
    rows = [line.split(" ||| ") for line in result.output.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "1", "1"]
    # Best first, by score; where a guard cut the best, a wider beam's hypotheses that ended lead (translate.retried):
    # by score within the ended ones and within the cut ones.
    from toolkit.deploy.translate import translate_batch

    t = open_model(tiny_export, "cpu")
    nbest = translate_batch(t, ["I lost."], DecodeOptions.for_manifest(t.manifest, beam=4, n_best=3))[0]
    assert [[h.text, f"{h.score:.4f}"] for h in nbest] == [r[1:3] for r in rows[:3]]
    for group in ([h.score for h in nbest if not h.stopped], [h.score for h in nbest if h.stopped]):
        assert group == sorted(group, reverse=True)


def test_empty_and_unknown_characters(cli, tiny_export):
    result = cli("translate", "--model", tiny_export, "-q", "", "Ĉu vi 😀 ŝatas 寿司?", "   ")
    assert result.exit_code == 0, result.output
    out = result.output.split("\n")
    assert out[0] == "" and out[1] != "" and out[2] == ""


LONG = ("the cat is sleeping on the sofa, the dog is playing in the garden and the children are reading their books "
        "while their mother is cooking dinner in the kitchen, then the whole family eats together at the big table "
        "and talks about the day until it is late at night")


def test_a_sentence_too_long_for_the_model_is_translated_in_pieces_and_refused_with_strict(cli, tiny_export, tmp_path):
    from toolkit.core import manifest
    from toolkit.core.textprep import fitted
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.deploy.translate import token_count

    m = manifest.load(tiny_export)
    tokenizer = open_tokenizer(m)
    pieces, count = fitted(LONG, token_count(tokenizer, m.max_len), m.max_len)
    assert count > m.max_len and len(pieces) > 1 and " ".join(pieces) == LONG  # the line is over the limit; nothing dropped
    src = tmp_path / "in.txt"
    src.write_text(f"Go.\n{LONG}\nI lost.\n", encoding="utf-8")
    result = cli("translate", "--model", tiny_export, "-i", src, "-o", tmp_path / "out.txt")
    assert result.exit_code == 0, result.output
    assert f"line 2 has a sentence of {count} tokens, more than the model's {m.max_len}; translated in {len(pieces)} pieces" in result.output
    assert "truncated" not in result.output
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    each = cli("translate", "--model", tiny_export, "-q", *pieces)  # every piece, as a sentence of its own
    assert each.exit_code == 0, each.output
    assert len(lines) == 3 and lines[1] == " ".join(each.output.splitlines())
    strict = cli("translate", "--model", tiny_export, "-i", src, "--strict")
    assert strict.exit_code == 2 and "input line 2" in strict.output and "Traceback" not in strict.output
    # A word longer than the model's positions is cut between characters; only --raw (the line as it is) truncates.
    word = cli("translate", "--model", tiny_export, "x" * 400)
    assert word.exit_code == 0 and "translated in" in word.output and "truncated" not in word.output
    raw = cli("translate", "--model", tiny_export, "--raw", LONG)
    assert raw.exit_code == 0 and "line 1 has a sentence" in raw.output and "truncated" in raw.output


def test_non_utf8_input_fails_with_the_line_number_and_keeps_the_old_output(cli, tiny_export, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"Go.\nCaf\xe9 noir\n")
    out.write_text("previous results\n")
    result = cli("translate", "--model", tiny_export, "-i", src, "-o", out)
    assert result.exit_code == 2
    assert "input line 2 is not valid UTF-8" in result.output
    assert out.read_text() == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_cuda_fallback_is_refused_with_its_reason_unless_allowed(cli, tiny_export, cuda_falls_back):
    refused = cli("translate", "--model", tiny_export, "--provider", "cuda", "Go.")
    assert refused.exit_code == 1
    message = refused.output.strip().splitlines()[-1]
    assert message.startswith("error: ONNX Runtime could not load its CUDA provider") and message.endswith("--allow-cpu-fallback runs on CPU)")
    assert "Traceback" not in refused.output
    allowed = cli("translate", "--model", tiny_export, "--provider", "cuda", "--allow-cpu-fallback", "Go.")
    assert allowed.exit_code == 0
    assert "CUDA unavailable, running on CPU" in allowed.output and "on cpu (onnxruntime" in allowed.output


def test_the_cuda_problem_is_named(monkeypatch):
    """Which of the three usual reasons stops the CUDA provider: a CPU-only build, no driver, a missing library."""
    import ctypes

    import onnxruntime as ort

    from toolkit.runtimes.onnxruntime import cuda
    from toolkit.runtimes.onnxruntime.cuda import cuda_problem

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert "build without the CUDA provider" in cuda_problem() and "tk-onnx-deploy[cuda]" in cuda_problem()
    monkeypatch.undo()
    monkeypatch.setattr(cuda, "no_nvidia_device", lambda: True)
    assert cuda_problem() == "no NVIDIA GPU or driver is visible (/dev/nvidiactl is missing)"
    # With a driver: the library the provider cannot load, as the dynamic loader names it.
    monkeypatch.setattr(cuda, "no_nvidia_device", lambda: False)
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
        loader_says = ""
    except OSError as e:
        loader_says = str(e).split(":")[0]
    problem = cuda_problem()
    assert (loader_says in problem and "LD_LIBRARY_PATH" in problem) if loader_says else problem == ""


def test_cuda_sessions_preload_the_pip_cuda_libraries(monkeypatch, tiny_export):
    """The cuda extra's nvidia-* packages are found without LD_LIBRARY_PATH: preload_dlls runs before a CUDA session."""
    import onnxruntime as ort

    from toolkit.core.errors import ProviderError
    from toolkit.runtimes.onnxruntime import cuda
    from toolkit.runtimes.onnxruntime.sessions import create_session

    calls = []
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: calls.append(1) or print("noise"), raising=False)
    monkeypatch.setattr(cuda, "_preloaded", False)
    try:
        create_session(tiny_export / "encoder.onnx", "cuda")
    except ProviderError:
        pass  # no GPU here: what matters is that the libraries were loaded before the session
    assert calls == [1]
    create_session(tiny_export / "encoder.onnx", "cpu")
    assert calls == [1]  # once per process, and never for CPU sessions


def test_default_provider_choice_is_printed(cli, tiny_export):
    result = cli("translate", "--model", tiny_export, "Go.")
    assert result.exit_code == 0 and "on cpu" in result.output


@pytest.mark.parametrize("problem", ["missing", "not-a-model", "mismatched", "random-init"])
def test_bad_model_directory_is_one_line_error(cli, tiny_export, random_export, tmp_path, problem):
    import shutil

    directory = tmp_path / "model"
    if problem == "not-a-model":
        directory.mkdir()
    elif problem == "mismatched":
        shutil.copytree(tiny_export, directory)
        manifest_path = directory / "manifest.json"
        d = json.loads(manifest_path.read_text())
        d["graphs"]["decoder"]["spec"]["inputs"][0]["name"] = "tokens"
        manifest_path.write_text(json.dumps(d))
    elif problem == "random-init":
        directory = random_export("transformer")
    result = cli("translate", "--model", directory, "Go.")
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and result.output.startswith("error: ")


def test_stdin_and_reference_scoring(tiny_export, tmp_path):
    refs = tmp_path / "refs.txt"
    refs.write_text("Va !\nJ'ai perdu.\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "translate", "--model", str(tiny_export), "--reference", str(refs)],
                          input="Go.\nI lost.\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    assert "BLEU" in proc.stderr and "chrF" in proc.stderr


def test_the_translate_path_never_imports_torch(tiny_export, assert_torch_free):
    assert_torch_free("translate", "--model", tiny_export, "-q", "Go.")


def test_torch_backend_from_the_command_line_matches_onnxruntime(cli, tiny_export, english):
    ort_out = cli("translate", "--model", tiny_export, "-q", *english[:8])
    torch_out = cli("translate", "--model", tiny_export, "-q", "--backend", "torch", *english[:8])
    assert ort_out.exit_code == torch_out.exit_code == 0
    assert ort_out.output == torch_out.output


@pytest.mark.slow
def test_bench_compares_every_backend_on_the_same_sentences(cli, tiny_export, tmp_path):
    """A bench row for each backend and search, and ONNX Runtime decodes exactly what PyTorch decodes."""
    out = tmp_path / "bench.json"
    result = cli("bench", "--model", tiny_export, "--sentences", 6, "--batch-size", 3, "--beam", 1, "--beam", 2,
                 "--repeat", 2, "--no-ct2", "--json", out)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    got = {(r["backend"], r["search"]) for r in rows}
    # optimized and int8 are timed by default, built in memory: the directory stores fp32 graphs only.
    assert {("pytorch textbook (full prefix)", "greedy"), ("pytorch cached", "greedy"), ("onnxruntime cpu", "greedy"),
            ("onnxruntime cpu optimized", "greedy"), ("onnxruntime cpu int8", "greedy"), ("pytorch cached", "beam 2"),
            ("onnxruntime cpu", "beam 2"), ("onnxruntime cpu optimized", "beam 2"), ("onnxruntime cpu int8", "beam 2")} <= got
    assert "onnxruntime cpu int8: graphs built in memory" in result.output
    assert all(r["sentences"] == 6 and r["seconds"] > 0 and r["tokens"] >= 6 for r in rows)
    table = result.output[result.output.index("backend ") :].splitlines()[2:]
    assert len(table) == len(rows)
    exact = [line for line in table if "int8" not in line]
    assert len(exact) == 7 and all(line.split()[-1] == "100%" for line in exact)  # fp32 and optimized: PyTorch's tokens


@pytest.mark.parametrize("name", ["transformer", "seq2seq"])
def test_device_side_row_selection_matches_numpy(name, random_export):
    """Finished rows and beam reordering go through a Gather graph on the decoder's device (the cache
    never visits the host on CUDA); it must pick exactly the rows numpy would, on each tensor's batch axis."""
    import numpy as np

    from toolkit.core import manifest
    from toolkit.core.decoding import pad_batch
    from toolkit.runtimes.onnxruntime.backend import OrtBackend
    from toolkit.runtimes.onnxruntime.loading import load_sessions

    plain = load_sessions(manifest.load(random_export(name)), "cpu").backend()
    backend = OrtBackend(plain.encoder, plain.decoder, plain.encoder_spec, plain.decoder_spec, io_binding=True)
    src, lens = pad_batch([[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]])
    state = backend.encode(src, lens)
    _, state = backend.step(np.full(4, 2, dtype=np.int64), state)
    rows = np.array([3, 0, 0, 2], dtype=np.int64)  # reordered, one row twice, one dropped
    picked = backend.select(state, rows)
    assert list(picked) == list(state)
    for n, v in state.items():
        np.testing.assert_array_equal(picked[n].numpy(), np.take(v.numpy(), rows, axis=backend.batch_axis[n]), err_msg=n)
    assert backend.batch_axis.get("state", 0) == (1 if name == "seq2seq" else 0)


def test_the_cuda_io_binding_path_decodes_as_the_cpu_host_path(model, english):
    """CUDA keeps the cache in device memory through I/O binding, with TopK and Gather graphs on the
    device; CPU runs plain numpy steps. Run on CPU, the binding path must give the same search."""
    from toolkit.runtimes.onnxruntime.backend import OrtBackend

    ids = model.tokenizer.encode(english)
    host, bound = model.backend(), model.backend()
    bound = OrtBackend(bound.encoder, bound.decoder, bound.encoder_spec, bound.decoder_spec, io_binding=True)
    assert not host.io_binding
    for opts in (DecodeOptions.bare(batch_size=8, max_len=model.manifest.max_len),
                 DecodeOptions.bare(beam=4, n_best=2, batch_size=8, max_len=model.manifest.max_len, loop_guard=True)):
        got = [[(h.tokens, round(h.score, 4)) for h in n] for n in decode_ids(bound, ids, opts)]
        assert got == [[(h.tokens, round(h.score, 4)) for h in n] for n in decode_ids(host, ids, opts)]


def test_an_output_ended_by_a_guard_is_warned_about_and_counted(cli, tmp_path):
    """A translation the length guard cut is named (line and guard) and counted; the summary counts sentences."""
    src = tmp_path / "in.txt"
    src.write_text("Go.\nThe old man who lived in the small house near the river said that he would come back tomorrow.\n"
                   "Hello. How are you?\n", encoding="utf-8")
    cut = cli("translate", "-i", src, "--max-len-a", "0.3", "--max-len-b", "0")
    assert cut.exit_code == 0, cut.output
    warnings = [line for line in cut.output.splitlines() if line.startswith("warning: line ")]
    assert any(w.startswith("warning: line 2: the length guard ended its translation at") for w in warnings), cut.output
    assert "raise --max-len-a or --max-len-b" in warnings[0]
    lines_cut = {w.split(":")[1] for w in warnings}
    summary = cut.output.strip().splitlines()[-1]
    assert summary.startswith("3 lines, 4 sentences in ")
    assert summary.endswith(f"; {len(lines_cut)} line{'s' if len(lines_cut) > 1 else ''} ended by a guard")
    plain = cli("translate", "-i", src)
    assert plain.exit_code == 0 and "warning" not in plain.output and "guard" not in plain.output
