"""SemiringLinear: y = x (x) W (x) bias over a semiring, the log-space linear layer of probabilistic
circuits and log-space networks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ops.matmul import semiring_matmul
from ..semirings import Semiring, resolve_semiring

__all__ = ["SemiringLinear"]


class SemiringLinear(nn.Module):
    """y[..., j] = (+)_k x[..., k] (x) W[k, j]  (x) bias[j]   over `semiring`.

    For the log semiring that is ``logsumexp_k(x_k + W_kj) + bias_j``: a mixture of the inputs'
    (log-)probabilities with log-weights W. For max / min it is a tropical linear map.

    Args:
        in_features: size k of each input's last dimension.
        out_features: size m of each output's last dimension.
        semiring: "log" (default), "max", "min", "std" or a Semiring subclass.
        bias: add a learnable per-output term, combined with the semiring's times.

    Shapes:
        input (..., in_features) -> output (..., out_features).

    Parameters:
        weight (in_features, out_features): initialised for the log semiring as log-weights of a
            uniform mixture plus noise, log(1/k) + N(0, 0.1); for the others as N(0, 1/sqrt(k)).
        bias (out_features): initialised to the semiring's one (0 for log / max / min, 1 for std).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        semiring: str | type[Semiring] = "log",
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.semiring = resolve_semiring(semiring)
        self.in_features = in_features
        self.out_features = out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(in_features, out_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        k = max(self.in_features, 1)
        with torch.no_grad():
            if self.semiring.name == "log":
                self.weight.normal_(0.0, 0.1).add_(-torch.log(torch.tensor(float(k))).item())
            else:
                self.weight.normal_(0.0, k**-0.5)
            if self.bias is not None:
                self.bias.fill_(self.semiring.one)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(
                f"SemiringLinear: input has shape {tuple(x.shape)}; its last dimension must be "
                f"in_features={self.in_features}"
            )
        rows = x.reshape(-1, self.in_features)  # one (N, k) x (k, m) product, not N products of 1 row
        y = semiring_matmul(rows, self.weight, self.semiring).reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            y = self.semiring.times(y, self.bias)
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"semiring={self.semiring.name}, bias={self.bias is not None}"
        )
