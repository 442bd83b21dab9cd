"""Decoding over a lexical shortlist on ONNX Runtime's CPU provider (toolkit.core.shortlist says what and why).

A batch's candidates are found from its padded source ids when it is encoded; the output layer's weights of their union
(the variant's own, int8 ones included) are gathered then, once, into the state, which every step feeds to the
shortlisted decoder (toolkit.graphs.shortlist) as it is, and `shortlist_mask` (rows, k) masks each row to its own
sentence's candidates. That mask has a row per decoder row, so it leaves with a finished row and follows its beam
(select, reorder_beams) as the encoder's outputs do; the steps' indices into the union map back to vocabulary ids.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolkit.core import shortlist as table_mod
from toolkit.core.decoding import ReorderMemory, reorder_rows, take_sentence_rows, top_k_rows
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest
from toolkit.graphs import shortlist as graph_mod
from toolkit.graphs.shortlist import MASK
from toolkit.runtimes.onnxruntime.backend import OrtBackend, direct_run

IDS = "shortlist_ids"  # the union's vocabulary ids, carried in the state for the steps' indices; not fed to the graph


@dataclass
class Shortlisting:
    """What a load with the shortlist needs: the table, the vocabulary's size and, once the decoder is rewritten
    (graph), the weight inputs it gathers once per batch."""

    table: table_mod.Shortlist
    vocab: int
    weights: list[graph_mod.Gathered] = field(default_factory=list)
    folder: Path | None = None  # where the rewritten graph's weights file lies (graph_mod.shortlisted)

    def graph(self, source: Path | bytes) -> bytes:
        graph, self.weights, self.folder = graph_mod.shortlisted(source, self.vocab)
        return graph

    def configure(self, options) -> None:
        """Session options for the rewritten graph's bytes: the folder its weights file lies in."""
        if self.folder is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.folder))


def prepare(m: Manifest) -> Shortlisting:
    """The directory's stored shortlist; one line when it stores none."""
    if m.shortlist is None:
        raise UsageError(f"{m.directory} stores no shortlist; make one with `tk export {m.directory} --shortlist FILE`")
    vocab = next(t.dims[-1] for t in m.specs()["decoder"].outputs if t.name == graph_mod.OUTPUT)
    table = table_mod.load(m.directory / m.shortlist.file)
    if max(table.targets.max(initial=0), table.always.max(initial=0)) >= vocab:
        raise UsageError(f"{m.directory / m.shortlist.file} lists tokens past the model's {vocab:,}; make it again for this model "
                         f"with `tk export {m.directory} --shortlist FILE`")
    return Shortlisting(table, int(vocab))


class ShortlistBackend(OrtBackend):
    """An OrtBackend (host memory only) over the shortlisted decoder; its steps answer in vocabulary ids."""

    def __init__(self, encoder, decoder, encoder_spec, decoder_spec, shortlisting: Shortlisting, stream_sessions=None):
        super().__init__(encoder, decoder, encoder_spec, decoder_spec, io_binding=False, stream_sessions=stream_sessions)
        self.shortlisting = shortlisting
        self.batch_axis = {**self.batch_axis, MASK: 0}
        weights = {g.name for g in shortlisting.weights}
        # The caches whose rows the graph takes itself (OrtBackend._graph_reorders) stay as they are too; at a beam step
        # so does the mask, the same on a sentence's rows.
        self._select_keep = frozenset({*weights, IDS}) | self._graph_reorders
        self._beams_keep = decoder_spec.constant_inputs | {*weights, IDS, MASK} | self._graph_reorders

    def encode(self, src: np.ndarray, src_len: np.ndarray):
        state = super().encode(src, src_len)
        ids, allowed = self.shortlisting.table.candidates(src, src_len)
        for gathered in self.shortlisting.weights:  # once per batch: every step feeds these same arrays
            state[gathered.name] = gathered.take(ids)
        state[MASK] = np.where(allowed, np.float32(0), np.float32(-np.inf))
        state[IDS] = ids
        return state

    def _run_host(self, token: np.ndarray, state):
        feeds = {n: v for n, v in state.items() if n != IDS}
        named = dict(zip(self.output_names, self._run_decoder(self.output_names, {"token": token, **feeds})))
        return named["log_probs"], self._next_host_state(state, named, len(token))

    def step(self, token: np.ndarray, state) -> tuple[np.ndarray, dict]:
        log_probs, new_state = self._run_host(token, state)
        full = np.full((len(log_probs), self.shortlisting.vocab), -np.inf, dtype=np.float32)
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
        if self._per_sentence is not None:  # the encoder's outputs one row per sentence (toolkit.graphs.sentence_cross)
            return take_sentence_rows(state, rows, self.batch_axis, self._per_sentence, keep=self._select_keep)
        # Into the search's memory, as OrtBackend.select: fresh arrays map new pages at every select (at beam 4, 401 ms
        # of an NLLB-600M int8 batch of 16, against 52 ms reused, for the first step's four copies of the encoder's
        # outputs where the graph reads one row of them a row).
        return reorder_rows(state, rows, self.batch_axis, keep=self._select_keep)

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
