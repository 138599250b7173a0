"""Fit the synthetic length model to the Azure 2023 traces and print the constants + fit table.

Model: a K-component mixture of bivariate normals over (log prompt, log output), i.e. a mixture
of bivariate log-normals, fitted by EM (k-means++ starts, several restarts, best likelihood
kept). Token counts are integers, so the fit sees ``log(x + U(-1/2, 1/2))`` (dequantisation)
and sampling rounds ``exp(z)`` back to the nearest integer, clipped to [1, observed max].

Usage (needs the real traces; they are found or downloaded like ``load_trace`` does):

    CBGYM_TRACE_DIR=../shared/traces python tools/fit_synthetic.py [--components 8]

Paste the printed ``LENGTH_FITS`` block into ``cbgym/workload/synthetic.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    from cbgym.workload import load_trace
    from cbgym.workload.synthetic import LengthMixture
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from cbgym.workload import load_trace
    from cbgym.workload.synthetic import LengthMixture

Fit = tuple[np.ndarray, np.ndarray, np.ndarray, float]  # weights, means, covariances, mean ll


def _log_density(x: np.ndarray, means: np.ndarray, covs: np.ndarray) -> np.ndarray:
    """log N(x | mean_k, cov_k) for every point and component, shape (n, K); 2-D closed form."""
    a, b, d = covs[:, 0, 0], covs[:, 0, 1], covs[:, 1, 1]
    det = a * d - b * b
    dx = x[:, None, 0] - means[None, :, 0]
    dy = x[:, None, 1] - means[None, :, 1]
    maha = (d * dx * dx - 2 * b * dx * dy + a * dy * dy) / det
    return -0.5 * maha - 0.5 * np.log(det) - np.log(2 * np.pi)


def _kmeans_pp(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    centres = [x[rng.integers(len(x))]]
    for _ in range(k - 1):
        dist = np.min([((x - c) ** 2).sum(1) for c in centres], axis=0)
        centres.append(x[rng.choice(len(x), p=dist / dist.sum())])
    return np.array(centres)


def fit_em(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 1000) -> Fit:
    """One EM run from a k-means++ start; returns (weights, means, covs, mean log-likelihood)."""
    means = _kmeans_pp(x, k, rng)
    covs = np.repeat(np.cov(x.T)[None] / k, k, axis=0)
    weights = np.full(k, 1.0 / k)
    previous = -np.inf
    for _ in range(iters):
        logp = np.log(weights) + _log_density(x, means, covs)
        top = logp.max(1, keepdims=True)
        norm = top[:, 0] + np.log(np.exp(logp - top).sum(1))
        resp = np.exp(logp - norm[:, None])
        mass = resp.sum(0) + 1e-12
        weights = mass / len(x)
        means = (resp.T @ x) / mass[:, None]
        diff = x[:, None, :] - means[None]
        covs = np.einsum("nk,nki,nkj->kij", resp, diff, diff) / mass[:, None, None]
        covs += 1e-4 * np.eye(2)  # keeps a component from collapsing onto one integer value
        ll = float(norm.mean())
        if ll - previous < 1e-7:
            break
        previous = ll
    return weights, means, covs, ll


def best_fit(x: np.ndarray, k: int, restarts: int, seed: int) -> Fit:
    """Best of ``restarts`` EM runs by log-likelihood."""
    fits = [fit_em(x, k, np.random.default_rng([seed, r])) for r in range(restarts)]
    return max(fits, key=lambda f: f[3])


def to_mixture(fit: Fit, max_prompt: int, max_output: int) -> LengthMixture:
    weights, means, covs, _ = fit
    order = np.argsort(-weights)
    return LengthMixture(
        # Rounded as printed, so the fit table describes exactly the constants pasted.
        weights=tuple(round(float(w), 6) for w in weights[order] / weights.sum()),
        means=tuple((round(float(m[0]), 6), round(float(m[1]), 6)) for m in means[order]),
        covs=tuple(
            (round(float(c[0, 0]), 6), round(float(c[0, 1]), 6), round(float(c[1, 1]), 6))
            for c in covs[order]
        ),
        max_prompt=max_prompt,
        max_output=max_output,
    )


def format_mixture(kind: str, mixture: LengthMixture) -> str:
    """Python source for one ``LENGTH_FITS`` entry, one row per component."""
    lines = [
        f'    "{kind}": LengthMixture.from_rows(',
        "        # weight, mean log p, mean log o, var log p, cov, var log o",
        "        [",
    ]
    for w, m, c in zip(mixture.weights, mixture.means, mixture.covs, strict=True):
        values = (w, *m, *c)
        lines.append("            (" + ", ".join(f"{v:.6f}" for v in values) + "),")
    lines += [
        "        ],",
        f"        max_prompt={mixture.max_prompt},",
        f"        max_output={mixture.max_output},",
        "    ),",
    ]
    return "\n".join(lines)


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance sup |F_a - F_b| (exact for integer data)."""
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def fit_table(real: tuple[np.ndarray, np.ndarray], synth: tuple[np.ndarray, np.ndarray]) -> str:
    rows = []
    for label, r, s in (("prompt", real[0], synth[0]), ("output", real[1], synth[1])):
        stats = [
            f"{f(r):.0f}/{f(s):.0f}"
            for f in (np.mean, np.median, lambda v: np.percentile(v, 90),
                      lambda v: np.percentile(v, 99))
        ]
        rows.append(f"{label:<7} {ks_distance(r, s):6.3f}  " + "  ".join(f"{c:>11}" for c in stats))
    rho = f"spearman(prompt, output) real {_spearman(*real):.3f} synthetic {_spearman(*synth):.3f}"
    head = f"{'':<7} {'KS':>6}  {'mean r/s':>11}  {'p50 r/s':>11}  {'p90 r/s':>11}  {'p99 r/s':>11}"
    return "\n".join([head, *rows, rho])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", type=int, default=8, help="mixture components K")
    parser.add_argument("--restarts", type=int, default=6, help="EM restarts per fit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=200_000, help="draws for the fit table")
    args = parser.parse_args(argv)

    blocks, tables = [], []
    for kind in ("conv", "code"):
        trace = load_trace(f"azure-{kind}-2023")
        real = (trace.prompt_tokens, trace.output_tokens)
        rng = np.random.default_rng(args.seed)
        jitter = rng.uniform(-0.5, 0.5, size=(len(trace), 2))
        x = np.log(np.column_stack(real).astype(float) + jitter)
        for k in sorted({1, args.components}):
            fit = best_fit(x, k, args.restarts, args.seed)
            mixture = to_mixture(fit, int(real[0].max()), int(real[1].max()))
            synth = mixture.sample(np.random.default_rng(args.seed + 1), args.samples)
            tables.append(f"{kind}, K={k} (mean log-lik {fit[3]:.4f}):\n{fit_table(real, synth)}")
        blocks.append(format_mixture(kind, mixture))
    print("# Fit quality (real r / synthetic s; KS = two-sample Kolmogorov-Smirnov distance):")
    print("\n\n".join(tables))
    print("\nLENGTH_FITS: dict[str, LengthMixture] = {\n" + "\n".join(blocks) + "\n}")


if __name__ == "__main__":
    main()
