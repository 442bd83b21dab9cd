"""Nadaraya-Watson kernel regression: attention pooling with a Gaussian kernel.

f(x) = sum_i softmax_i(-((x - x_i) * w)^2 / 2) y_i

With w fixed at 1 this is the non-parametric estimator; with w learned it is
the parametric one.
"""

from __future__ import annotations

import torch
from torch import nn


def true_function(x: torch.Tensor) -> torch.Tensor:
    """The synthetic target of the classic example: 2 sin(x) + x^0.8."""
    return 2 * torch.sin(x) + x**0.8


def synthetic_data(n_train: int = 50, seed: int = 0, noise: float = 0.5):
    """Training points on [0, 5) with N(0, noise) noise, and a clean test grid.

    Returns (x_train, y_train, x_test, y_truth), x_train sorted, all 1-D float32.
    """
    gen = torch.Generator().manual_seed(seed)
    x_train, _ = torch.sort(torch.rand(n_train, generator=gen) * 5)
    y_train = true_function(x_train) + torch.normal(0.0, noise, (n_train,), generator=gen)
    x_test = torch.arange(0, 5, 0.1)
    return x_train, y_train, x_test, true_function(x_test)


class NWKernelRegression(nn.Module):
    """Nadaraya-Watson regression with a Gaussian kernel of width 1/w.

    queries (n_q,), keys (n_q, n_kv), values (n_q, n_kv) -> (n_q,).
    The weights of the last call are kept in `attention_weights` (n_q, n_kv).
    """

    def __init__(self, learn_width: bool = True):
        super().__init__()
        self.learn_width = learn_width
        self.w = nn.Parameter(torch.ones(1), requires_grad=learn_width)
        self.attention_weights: torch.Tensor | None = None

    def forward(self, queries, keys, values):
        diff = (queries.unsqueeze(-1) - keys) * self.w
        self.attention_weights = torch.softmax(-(diff**2) / 2, dim=-1)
        return (self.attention_weights * values).sum(-1)


def leave_one_out(x_train: torch.Tensor, y_train: torch.Tensor):
    """Keys and values for training: each point attends to all the others, never itself.

    Without this the learned width grows without bound: a point that sees its own
    label is best predicted by a kernel that only looks at itself.
    """
    n = x_train.shape[0]
    keep = ~torch.eye(n, dtype=torch.bool)
    keys = x_train.repeat(n, 1)[keep].reshape(n, n - 1)
    values = y_train.repeat(n, 1)[keep].reshape(n, n - 1)
    return keys, values


def fit(model: NWKernelRegression, x_train, y_train, epochs: int = 5, lr: float = 0.5):
    """Fits the width by SGD on the leave-one-out squared error; yields (epoch, loss)."""
    keys, values = leave_one_out(x_train, y_train)
    if not model.learn_width:
        return
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        opt.zero_grad()
        loss = ((model(x_train, keys, values) - y_train) ** 2).sum() / 2
        loss.backward()
        opt.step()
        yield epoch, loss.item()


def test_mse(model: NWKernelRegression, x_train, y_train, x_test, y_truth) -> float:
    """Mean squared error against the noise-free function on the test grid."""
    with torch.no_grad():
        n_test = x_test.shape[0]
        pred = model(x_test, x_train.repeat(n_test, 1), y_train.repeat(n_test, 1))
        return float(((pred - y_truth) ** 2).mean())


__all__ = ["NWKernelRegression", "synthetic_data", "leave_one_out", "fit", "test_mse", "true_function"]
