"""Calling a transformers layer the same way on both lines users have: 4.x (beside Optimum, which pins it below 4.58)
and 5.x. The layers compute the same thing; their call differs: 4.x takes `layer_head_mask` (required by encoder
layers), names the cache `past_key_values` and returns a tuple; 5.x dropped head masks, names it `cache` and returns
the hidden states. One function here, so each builder calls transformers' own layer code on either line."""

from __future__ import annotations

import inspect
from functools import cache

import torch
from torch import nn


@cache
def _parameters(forward_of: type) -> frozenset[str]:
    return frozenset(inspect.signature(forward_of.forward).parameters)


def call_layer(layer: nn.Module, *args, layer_cache: object = None, positions: torch.Tensor | None = None,
               all_outputs: bool = False, **kwargs):
    """`layer(*args, **kwargs)` with the cache under the name this transformers line uses, head masks off where they
    are asked for, `positions` as `cache_position` where the layer reads it (4.x's T5 derives its relative-bias length
    from it), and the hidden states out (not the tuple 4.x returns); `all_outputs`: every output, as a tuple."""
    params = _parameters(type(layer))
    if "layer_head_mask" in params:
        kwargs.setdefault("layer_head_mask", None)
    if layer_cache is not None:
        kwargs["past_key_values" if "past_key_values" in params else "cache"] = layer_cache
    if positions is not None and "cache_position" in params:
        kwargs["cache_position"] = positions
    out = layer(*args, **kwargs)
    if all_outputs:
        return out if isinstance(out, tuple) else (out,)
    return out[0] if isinstance(out, tuple) else out
