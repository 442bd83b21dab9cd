"""Decoding over a lexical shortlist on ONNX Runtime's CPU provider (toolkit.core.shortlist says what and why).

A batch's candidates are found from its padded source ids when it is encoded; the output layer's weight rows of their
union are gathered then, once, into the state as `shortlist_weight` (hidden, k), which every step feeds to the
shortlisted decoder (toolkit.graphs.shortlist) as it is, and `shortlist_bias` (rows, k) masks each row to its own
sentence's candidates. That bias has a row per decoder row, so it leaves with a finished row and follows its beam
(select, reorder_beams) as the encoder's outputs do; the steps' indices into the union map back to vocabulary ids.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core import shortlist as table_mod
from toolkit.core.decoding import ReorderMemory, next_host_state, reorder_rows, take_rows, top_k_rows
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest
from toolkit.graphs import shortlist as graph_mod
from toolkit.graphs.shortlist import BIAS, WEIGHT
from toolkit.runtimes.onnxruntime.backend import OrtBackend, direct_run

IDS = "shortlist_ids"  # the union's vocabulary ids, carried in the state for the steps' indices; not fed to the graph


@dataclass(frozen=True)
class Shortlisting:
    """What a load with the shortlist needs: the table, the fp32 decoder's output layer and its weights."""

    table: table_mod.Shortlist
    layer: graph_mod.OutputLayer
    weight: np.ndarray  # (vocabulary, hidden) float32
    bias: np.ndarray  # (vocabulary,) float32

    def graph(self, source: Path | bytes) -> bytes:
        return graph_mod.shortlisted(source, self.layer)


def prepare(m: Manifest) -> Shortlisting:
    """The directory's stored shortlist and its decoder's output layer; one line when it stores none."""
    import onnx

    if m.shortlist is None:
        raise UsageError(f"{m.directory} stores no shortlist; make one with `tk export {m.directory} --shortlist FILE`")
    fp32 = m.graph_path("decoder")
    layer = graph_mod.output_layer(onnx.load(fp32, load_external_data=False))
    weight, bias = graph_mod.output_weights(fp32, layer)
    return Shortlisting(table_mod.load(m.directory / m.shortlist.file), layer, weight, bias)


class ShortlistBackend(OrtBackend):
    """An OrtBackend (host memory only) over the shortlisted decoder; its steps answer in vocabulary ids."""

    def __init__(self, encoder, decoder, encoder_spec, decoder_spec, shortlisting: Shortlisting, stream_sessions=None):
        super().__init__(encoder, decoder, encoder_spec, decoder_spec, io_binding=False, stream_sessions=stream_sessions)
        self.shortlisting = shortlisting
        self.batch_axis = {**self.batch_axis, BIAS: 0}
        self._select_keep = frozenset({WEIGHT, IDS})
        self._beams_keep = decoder_spec.constant_inputs | {WEIGHT, IDS, BIAS}  # the bias is the same on a sentence's rows

    def encode(self, src: np.ndarray, src_len: np.ndarray):
        state = super().encode(src, src_len)
        s = self.shortlisting
        ids, allowed = s.table.candidates(src, src_len)
        state[WEIGHT] = np.ascontiguousarray(s.weight[ids].T)  # once per batch: every step feeds this same array
        state[BIAS] = np.where(allowed, s.bias[ids][None, :], np.float32(-np.inf)).astype(np.float32)
        state[IDS] = ids
        return state

    def _run_host(self, token: np.ndarray, state):
        feeds = {n: v for n, v in state.items() if n != IDS}
        named = dict(zip(self.output_names, self._run_decoder(self.output_names, {"token": token, **feeds})))
        return named["log_probs"], next_host_state(self.decoder_spec, state, named)

    def step(self, token: np.ndarray, state) -> tuple[np.ndarray, dict]:
        log_probs, new_state = self._run_host(token, state)
        full = np.full((len(log_probs), len(self.shortlisting.bias)), -np.inf, dtype=np.float32)
        full[:, state[IDS]] = log_probs
        return full, new_state

    def step_top_k(self, token: np.ndarray, state, k: int):
        log_probs, new_state = self._run_host(token, state)
        if k == 1:
            values, indices = top_k_rows(log_probs, 1)
        else:
            values, indices = self.ranker.run(None, {"log_probs": log_probs, "k": np.array([min(k, log_probs.shape[-1])], dtype=np.int64)})
        return values, state[IDS][indices], new_state

    def select(self, state, rows: np.ndarray):
        return take_rows(state, rows, self.batch_axis, keep=self._select_keep)

    def reorder_beams(self, state, rows: np.ndarray):
        return reorder_rows(state, rows, self.batch_axis, keep=self._beams_keep)

    def _twin(self) -> ShortlistBackend:
        twin = copy.copy(self)
        twin.__dict__.pop("_spare_forks", None)
        twin._reorder_memory = ReorderMemory(per_thread=False)
        return twin

    def fork(self) -> ShortlistBackend:
        return self._twin()  # the sessions and ranking helpers are shared, as OrtBackend.fork shares them

    def for_streams(self) -> ShortlistBackend:
        if self.stream_sessions is None:
            return self
        if self._streams_backend is None:
            sessions = self.stream_sessions()
            twin = self._twin()
            twin.encoder, twin.decoder = sessions["encoder"], sessions["decoder"]
            twin._run_decoder = direct_run(sessions["decoder"])
            twin._helpers, twin._helpers_lock = {}, threading.Lock()
            twin.stream_sessions, twin._reorder_memory = None, ReorderMemory()
            self._streams_backend = twin
        return self._streams_backend
