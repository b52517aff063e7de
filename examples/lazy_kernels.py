"""Demo: lazy kernel reductions (semiring_ops.lazy) on three classic problems, none of which ever holds an
M x N matrix in memory.

* Gaussian kernel ridge regression: fit a noisy 2-D function at 10,000 points by solving (K + lambda I) a = y
  with conjugate gradients, each step one lazy product K @ v (a sum reduction); report the test error beside
  the noise level and a constant predictor.
* Entropic optimal transport (Sinkhorn): the log-domain iterations between two point clouds of 5,000 points,
  each half-step a softmin, i.e. a logsumexp reduction; report the transport cost, the marginal error, the
  same iterations done densely in torch for comparison, and a gradient of the cost through autograd.
* k-nearest-neighbour classification: argKmin over 20,000 labelled points for 5,000 queries (four classes
  on interleaved spirals); report the accuracy for k = 1 and k = 10, checked against torch.cdist + topk.

Runs on the CPU (about 20 s on 2 cores, the kernels' first-use compile included) or on the GPU when one is
present. Usage: python examples/lazy_kernels.py  (see docs/lazy.md for the API)
"""

from __future__ import annotations

import math
import time

import torch

from semiring_ops.lazy import LazyTensor, Vi, Vj

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def clock() -> float:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


# ---------------------------------------------------------------- 1. kernel ridge regression


def target_function(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(3 * x[:, :1]) * torch.cos(2 * x[:, 1:]) + 0.5 * torch.exp(-8 * (x**2).sum(1, keepdim=True))


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor, sigma: float) -> LazyTensor:
    """K_ij = exp(-|x_i - y_j|^2 / (2 sigma^2)), symbolic: (len(x), len(y), 1)."""
    D_ij = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
    return (-D_ij / (2 * sigma**2)).exp()


def conjugate_gradient(matvec, b: torch.Tensor, tol: float = 1e-5, max_iter: int = 500) -> tuple[torch.Tensor, int]:
    """Solves matvec(a) = b for a symmetric positive definite operator; (a, iterations)."""
    a = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = (r * r).sum()
    stop = tol**2 * rr
    for it in range(1, max_iter + 1):
        Ap = matvec(p)
        alpha = rr / (p * Ap).sum()
        a += alpha * p
        r -= alpha * Ap
        rr_new = (r * r).sum()
        if rr_new <= stop:
            return a, it
        p = r + (rr_new / rr) * p
        rr = rr_new
    return a, max_iter


def kernel_ridge_regression(gen: torch.Generator) -> None:
    print("1. Gaussian kernel ridge regression, solved by conjugate gradients on K @ v")
    n, n_test, noise, sigma, lam = 10_000, 2_000, 0.1, 0.1, 1.0
    x = (torch.rand(n, 2, generator=gen) * 2 - 1).to(DEVICE)
    y = (target_function(x.cpu()) + noise * torch.randn(n, 1, generator=gen)).to(DEVICE)
    x_test = (torch.rand(n_test, 2, generator=gen) * 2 - 1).to(DEVICE)
    t0 = clock()
    K = gaussian_kernel(x, x, sigma)  # (n, n, 1), nothing computed yet
    a, iters = conjugate_gradient(lambda v: K @ v + lam * v, y)
    pred = gaussian_kernel(x_test, x, sigma) @ a  # (n_test, 1)
    t1 = clock()
    truth = target_function(x_test.cpu()).to(DEVICE)
    rmse = (pred - truth).pow(2).mean().sqrt().item()
    baseline = (truth - y.mean()).pow(2).mean().sqrt().item()
    residual = ((K @ a + lam * a - y).norm() / y.norm()).item()
    print(f"   {n} training points, sigma {sigma}, lambda {lam}: CG converged in {iters} products K @ v")
    print(f"   relative residual |(K + lambda I) a - y| / |y| = {residual:.1e}")
    print(
        f"   test RMSE against the noiseless function {rmse:.4f} (noise std {noise}, constant predictor {baseline:.3f})"
    )
    print(f"   {t1 - t0:.2f} s; a dense K would take {n * n * 4 / 2**20:.0f} MiB, the lazy one takes none")


# ---------------------------------------------------------------- 2. entropic optimal transport


def eps_schedule(eps: float, iters: int) -> list[float]:
    """epsilon-scaling: start blurry (eps = 1/2, then halved each iteration) and end at eps, which converges
    in far fewer iterations than eps from the start. (Every value is a non-integer float, so a parameter of
    one compiled kernel; an integer-valued float such as 1.0 would be written into a second kernel.)"""
    return [max(eps, 0.5 ** (k + 1)) for k in range(iters)]


def sinkhorn(x, y, log_a, log_b, eps: float, iters: int):
    """Log-domain Sinkhorn for the cost |x_i - y_j|^2 / 2: the dual potentials (f, g), each update a softmin
    f_i = -eps log sum_j exp((g_j - C_ij) / eps + log b_j), i.e. a logsumexp reduction over j (over i for g)."""
    x_i, y_j = Vi(x), Vj(y)
    C_ij = ((x_i - y_j) ** 2).sum(-1) / 2
    f, g = torch.zeros_like(log_a), torch.zeros_like(log_b)
    for e in eps_schedule(eps, iters):
        f = -e * ((Vj(g) - C_ij) / e + Vj(log_b)).logsumexp(dim=1)  # softmin over j: (len(x), 1)
        g = -e * ((Vi(f) - C_ij) / e + Vi(log_a)).logsumexp(dim=0)  # softmin over i: (len(y), 1)
    return f, g


def sinkhorn_dense(x, y, log_a, log_b, eps: float, iters: int):
    """The same iterations with the (len(x), len(y)) cost matrix in memory."""
    C = torch.cdist(x, y) ** 2 / 2
    f, g = torch.zeros_like(log_a), torch.zeros_like(log_b)
    for e in eps_schedule(eps, iters):
        f = -e * torch.logsumexp((g.T - C) / e + log_b.T, dim=1, keepdim=True)
        g = -e * torch.logsumexp((f - C) / e + log_a, dim=0).unsqueeze(1)
    return f, g


def optimal_transport(gen: torch.Generator) -> None:
    print("2. Entropic optimal transport (Sinkhorn), softmin = logsumexp reductions")
    n, m, eps, iters = 4_000, 4_000, 0.01, 40
    x = (0.3 * torch.randn(n, 2, generator=gen) + torch.tensor([-1.0, 0.0])).to(DEVICE)  # a Gaussian blob
    theta = 2 * math.pi * torch.rand(m, generator=gen)
    ring = torch.stack([theta.cos(), theta.sin()], 1) * (0.6 + 0.05 * torch.randn(m, 1, generator=gen))
    y = (ring + torch.tensor([1.0, 0.0])).to(DEVICE)  # a ring
    log_a = torch.full((n, 1), -math.log(n), device=DEVICE)
    log_b = torch.full((m, 1), -math.log(m), device=DEVICE)

    t0 = clock()
    f, g = sinkhorn(x, y, log_a, log_b, eps, iters)
    t1 = clock()
    cost = (f.mean() + g.mean()).item()  # the dual objective at the optimum: <a, f> + <b, g>
    # the plan's row sums: pi_i = a_i sum_j exp((f_i + g_j - C_ij) / eps) b_j, which should equal a_i = 1/n
    C_ij = ((Vi(x) - Vj(y)) ** 2).sum(-1) / 2
    log_rows = f / eps + log_a + ((Vj(g) - C_ij) / eps + Vj(log_b)).logsumexp(dim=1)
    marginal_err = (log_rows.exp() - log_a.exp()).abs().sum().item()
    print(f"   {n} + {m} points, eps {eps}, {iters} iterations: cost {cost:.4f}, marginal error {marginal_err:.1e}")
    print(f"   lazy: {t1 - t0:.2f} s ({2 * iters} logsumexp reductions of {n * m / 1e6:.0f}M terms)")

    few = 4
    t0 = clock()
    f_d, g_d = sinkhorn_dense(x, y, log_a, log_b, eps, few)
    t1 = clock()
    f_l, g_l = sinkhorn(x, y, log_a, log_b, eps, few)
    t2 = clock()
    agree = max((f_l - f_d).abs().max().item(), (g_l - g_d).abs().max().item())
    print(
        f"   {few} iterations densely in torch ({n * m * 4 / 2**20:.0f} MiB cost matrix): {t1 - t0:.2f} s, lazy "
        f"{t2 - t1:.2f} s; the potentials agree to {agree:.1e}"
    )

    # The cost's gradient with respect to x: with the potentials at their optimum (envelope theorem), it is
    # the gradient of <a, f(x)> through one more softmin, which autograd takes through the lazy logsumexp.
    xr = x.clone().requires_grad_()
    C_r = ((Vi(xr) - Vj(y)) ** 2).sum(-1) / 2
    f_r = -eps * ((Vj(g) - C_r) / eps + Vj(log_b)).logsumexp(dim=1)
    (grad,) = torch.autograd.grad(f_r.mean() + g.mean(), xr)
    # grad_i = a_i (x_i - T(x_i)), T the barycentric map: a step of n / 2 moves each x_i halfway to T(x_i)
    x_moved = x - (n / 2) * grad
    f2, g2 = sinkhorn(x_moved, y, log_a, log_b, eps, iters)
    print(
        f"   autograd through logsumexp: a gradient step moves each point halfway to its transport target; the "
        f"cost drops to {(f2.mean() + g2.mean()).item():.4f} (about 1/4 of {cost:.4f}, as a halfway move should)"
    )


# ---------------------------------------------------------------- 3. k-nearest neighbours


def spirals(n: int, classes: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved noisy 2-D spirals, one per class."""
    label = torch.randint(classes, (n,), generator=gen)
    r = torch.rand(n, generator=gen)
    angle = 3 * math.pi * r + 2 * math.pi * label / classes
    pts = torch.stack([r * angle.cos(), r * angle.sin()], 1) + 0.04 * torch.randn(n, 2, generator=gen)
    return pts, label


def knn_classification(gen: torch.Generator) -> None:
    print("3. k-nearest-neighbour classification with argKmin")
    n_train, n_test, classes, k = 20_000, 5_000, 4, 10
    x_train, y_train = spirals(n_train, classes, gen)
    x_test, y_test = spirals(n_test, classes, gen)
    x_train, y_train, x_test, y_test = (t.to(DEVICE) for t in (x_train, y_train, x_test, y_test))

    t0 = clock()
    D_ij = ((Vi(x_test) - Vj(x_train)) ** 2).sum(-1)  # (n_test, n_train, 1), symbolic
    knn = D_ij.argKmin(k, dim=1)  # (n_test, k) int64, nearest first
    nearest = D_ij.argmin(dim=1)  # (n_test, 1)
    t1 = clock()
    votes = torch.nn.functional.one_hot(y_train[knn], classes).sum(1)
    acc_k = (votes.argmax(1) == y_test).float().mean().item()
    acc_1 = (y_train[nearest[:, 0]] == y_test).float().mean().item()
    print(f"   {n_train} training points, {n_test} queries, {classes} classes (interleaved spirals)")
    print(f"   test accuracy: 1-NN {acc_1:.1%}, {k}-NN {acc_k:.1%}")
    print(f"   argKmin + argmin: {t1 - t0:.2f} s")

    check = 1000
    ref = torch.cdist(x_test[:check], x_train).topk(k, dim=1, largest=False).indices
    same = (knn[:check].sort(1).values == ref.sort(1).values).all(1).float().mean().item()
    print(f"   the same {k} neighbours as torch.cdist + topk for {same:.1%} of {check} queries")


def main() -> None:
    print(f"semiring_ops.lazy on {DEVICE} (torch {torch.__version__}, {torch.get_num_threads()} CPU threads)")
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    kernel_ridge_regression(gen)
    optimal_transport(gen)
    knn_classification(gen)
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
