"""PyTorch step backend for the shared decoding loop: the reference that the graphs are held to.

`tk translate --backend torch` hands open_model reference_backends, so the deploy path decodes with it through the
one loop without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from toolkit.core.decoding import StepBackend, empty_cache
from toolkit.core.graphs import GraphSpec
from toolkit.core.manifest import Manifest


class TorchBackend(StepBackend):
    """Runs a seq2seq model's `encode` / `decode_step` with the cache the graphs declare."""

    def __init__(self, model: torch.nn.Module, encoder: GraphSpec, decoder: GraphSpec, device: str = "cpu"):
        """`device`: where the model runs ("cpu" or "cuda"); on another device than the model's own, a copy is
        moved there, so the CPU reference that verify holds the graphs to is never disturbed."""
        self.device = torch.device(device)
        if next(model.parameters()).device != self.device:
            from toolkit.pytorch.reference import copy_model

            model = copy_model(model).to(self.device)
        self.model = model.eval()
        self.encoder, self.decoder = encoder, decoder
        # Which axis of each state tensor is the batch, read from the declaration.
        self.batch_axis = {t.name: t.dims.index("batch") for t in decoder.inputs[1:]}

    @torch.inference_mode()
    def encode_outputs(self, src: np.ndarray, src_len: np.ndarray) -> dict[str, torch.Tensor]:
        """Everything the model's encode returns (verify compares it with the encoder graph), and src_len, which the
        decoder graph takes too (a model's encode need not return it)."""
        return {"src_len": self._tensor(src_len), **self.model.encode(self._tensor(src), self._tensor(src_len))}

    def initial_state(self, encoded: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
        """The decoder state: encoder outputs plus empty caches, as the decoder graph declares."""
        state = {**encoded, **{k: self._tensor(v) for k, v in empty_cache(self.decoder, encoded, batch).items()}}
        return {name: state[name] for name in self.batch_axis}

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)

    def encode(self, src: np.ndarray, src_len: np.ndarray) -> dict[str, torch.Tensor]:
        return self.initial_state(self.encode_outputs(src, src_len), len(src))

    def _decode_step(self, token: np.ndarray, state: dict[str, torch.Tensor]):
        log_probs, cache = self.model.decode_step(self._tensor(token), state)
        return log_probs, {name: cache[name] for name in self.batch_axis}

    @torch.inference_mode()
    def step(self, token: np.ndarray, state: dict[str, torch.Tensor]):
        log_probs, state = self._decode_step(token, state)
        return log_probs.cpu().numpy(), state

    @torch.inference_mode()
    def step_top_k(self, token: np.ndarray, state: dict[str, torch.Tensor], k: int):
        log_probs, state = self._decode_step(token, state)
        values, indices = torch.topk(log_probs, min(k, log_probs.shape[-1]), dim=-1)
        return values.cpu().numpy(), indices.cpu().numpy(), state

    def fork(self) -> TorchBackend:
        # Inference-mode forward passes share no state between calls.
        return self

    def select(self, state: dict[str, torch.Tensor], rows: np.ndarray) -> dict[str, torch.Tensor]:
        index = self._tensor(rows)
        return {k: v.index_select(self.batch_axis[k], index) for k, v in state.items()}


def reference_backends(m: Manifest) -> Callable[[], TorchBackend]:
    """The directory's reference model on the CPU (its checkpoint, or the graphs' own weights), as fresh step backends
    for toolkit.deploy.translate.open_model's `reference` (`tk translate --backend torch`)."""
    from toolkit.pytorch.reference import load_reference

    _, _, model, _ = load_reference(m)
    specs = m.specs()
    return lambda: TorchBackend(model, specs["encoder"], specs["decoder"])
