# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A tour of rfjax
#
# Random features replace a kernel $K(x, y)$ by a dot product $\phi(x)^\top \phi(y)$ of
# finite-dimensional random features. rfjax splits this into three pieces that compose:
#
# 1. a **coupling** (`rfjax.projections`) draws the projection vectors $w_1, \dots, w_m$ jointly
#    (i.i.d., orthogonal, simplex, ...);
# 2. a **feature map** (`rfjax.features`) turns a drawn projection into features;
# 3. **exact kernels** (`rfjax.kernels`) and **closed-form errors** (`rfjax.theory`) say what the
#    estimate should be and how far it should stray.
#
# This notebook draws couplings, compares feature maps and checks a Monte Carlo estimate of the
# error against the closed form of the Simplex Random Features paper (Reid et al. 2023,
# arXiv:2301.13856). Set `RFJAX_COLAB_QUICK=1` for a seconds-long run with small sizes.

# %%
# On Colab, install rfjax first; locally run this notebook in an environment where rfjax is
# installed (`pip install -e ".[notebooks]"` in the repository).
# ruff: noqa: E402, RUF100  (in the .py source the imports below follow this cell)
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    # rfjax has no release on a package index yet: it is installed from its repository. Set
    # RFJAX_REPOSITORY (in a cell before this one) to the repository's git URL, e.g.
    # os.environ["RFJAX_REPOSITORY"] = "https://github.com/OWNER/rfjax", or to the path of a
    # checkout uploaded to the runtime.
    repository = os.environ.get("RFJAX_REPOSITORY", "")
    if not repository:
        raise RuntimeError(
            "set os.environ['RFJAX_REPOSITORY'] to the git URL of the rfjax repository (or the "
            "path of a checkout): rfjax is not on a package index yet"
        )
    spec = repository if os.path.isdir(repository) else f"rfjax @ git+{repository}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

QUICK = os.environ.get("RFJAX_COLAB_QUICK", "0") == "1"

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from rfjax import features, kernels, projections, theory

DIM = 8  # input dimension d
NUM_DRAWS = 500 if QUICK else 20_000  # independent projections in the Monte Carlo
print(f"quick={QUICK}, d={DIM}, draws={NUM_DRAWS}, JAX backend: {jax.default_backend()}")

# %% [markdown]
# ## 1. Couplings
#
# Every coupling is a sampler `(key, dim, num_features) -> Projection`, looked up by name.
# The marginally exact ones draw every row exactly from $N(0, I_d)$, so every feature map stays
# unbiased and the coupling only changes the variance.

# %%
print("available:        ", projections.available())
print("marginally exact: ", projections.marginally_exact())

# %% [markdown]
# A batch of independent draws is one `jax.vmap` over keys: the result is a single `Projection`
# pytree whose leaves carry a leading axis of size `NUM_DRAWS`. We draw $m = 2d$ rows (two
# independent blocks of $d$ rows for ORF and SimRF) and reuse these draws below.

# %%
COUPLINGS = {"gaussian": "IIDRF", "orthogonal": "ORF", "simplex": "SimRF"}
NUM_FEATURES = 2 * DIM  # m


def draw_batch(coupling: str, key: jax.Array) -> projections.Projection:
    """NUM_DRAWS independent projections of NUM_FEATURES rows, as one batched pytree."""
    sampler = projections.get(coupling)
    keys = jax.random.split(key, NUM_DRAWS)
    return jax.vmap(lambda k: sampler(k, DIM, NUM_FEATURES))(keys)


draws = {c: draw_batch(c, jax.random.key(i)) for i, c in enumerate(COUPLINGS)}
print({c: draws[c].matrix().shape for c in COUPLINGS})

# %% [markdown]
# The couplings differ in the angles between the projection directions within one block of
# $d$ rows: i.i.d. Gaussian rows (IIDRF) point anywhere, orthogonal rows (ORF) are at
# $90°$, simplex rows (SimRF) point at the vertices of a regular simplex, with pairwise cosine
# $-1/(d-1)$. Below: the Gram matrix of the unit directions $\hat w_i^\top \hat w_j$ of the
# first block of the first draw.


# %%
def direction_gram(projection: projections.Projection) -> np.ndarray:
    """Cosines between the first d projection directions of the first draw of a batch."""
    w = projection.matrix()[0, :DIM]
    unit = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
    return np.asarray(unit @ unit.T)


grams = {c: direction_gram(draws[c]) for c in COUPLINGS}
fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
for ax, (coupling, gram) in zip(axes, grams.items(), strict=True):
    image = ax.imshow(gram, vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_title(f"{COUPLINGS[coupling]} ({coupling})")
    ax.set_xticks([])
    ax.set_yticks([])
fig.colorbar(image, ax=axes, shrink=0.8, label="cosine")
plt.show()
for coupling, gram in grams.items():
    off = gram[~np.eye(DIM, dtype=bool)]
    print(f"{coupling:>10}: off-diagonal cosines in [{off.min():+.3f}, {off.max():+.3f}]")
print(f"simplex target -1/(d-1) = {-1 / (DIM - 1):+.3f}")

# %% [markdown]
# ## 2. Feature maps against the exact kernel
#
# One projection feeds many feature maps. For a fixed pair $(x, y)$ we draw `NUM_DRAWS`
# independent projections with `jax.vmap` over keys, form each estimate $\phi(x)^\top\phi(y)$
# and compare the mean with the exact kernel and the mean squared error with its closed form:
#
# | map | kernel | closed-form MSE |
# |---|---|---|
# | `positive_features` | softmax $e^{x^\top y}$ | `theory.prf_mse(..., kernel="softmax")` |
# | `positive_features(antithetic=True)` | softmax | `theory.positive_antithetic_mse` |
# | `trigonometric_features` | softmax | `theory.trigonometric_mse` |
# | `positive_features(kernel="gaussian")` | Gaussian $e^{-\lVert x-y \rVert^2/2}$ | `prf_mse` |
# | `fourier_features` | Gaussian | `theory.rff_mse` |
#
# The antithetic map has width $2m$; the others as listed in their docstrings.

# %%
rng = np.random.default_rng(0)
x_pair = 0.35 * rng.standard_normal(DIM)
y_pair = 0.35 * rng.standard_normal(DIM)

MAPS = {
    # name: (feature map, exact kernel, closed-form MSE for m i.i.d. rows)
    "positive (softmax)": (
        features.positive_features,
        kernels.softmax,
        lambda x, y, m: theory.prf_mse(x, y, m, kernel="softmax"),
    ),
    "positive antithetic (softmax)": (
        lambda x, w: features.positive_features(x, w, antithetic=True),
        kernels.softmax,
        theory.positive_antithetic_mse,
    ),
    "trigonometric (softmax)": (
        features.trigonometric_features,
        kernels.softmax,
        theory.trigonometric_mse,
    ),
    "positive (Gaussian)": (
        lambda x, w: features.positive_features(x, w, kernel="gaussian"),
        kernels.gaussian,
        lambda x, y, m: theory.prf_mse(x, y, m, kernel="gaussian"),
    ),
    "Fourier sin/cos (Gaussian)": (features.fourier_features, kernels.gaussian, theory.rff_mse),
}

x32, y32 = jnp.asarray(x_pair, jnp.float32), jnp.asarray(y_pair, jnp.float32)
print(f"{'map':<30} {'exact':>8} {'mean +- SE':>20} {'MSE (MC)':>20} {'MSE (theory)':>12}")
for name, (feature_map, kernel, mse) in MAPS.items():
    estimates = jax.jit(jax.vmap(lambda w, f=feature_map: features.estimate(f(x32, w), f(y32, w))))(
        draws["gaussian"]
    )
    estimates = np.asarray(estimates, np.float64)
    exact = float(kernel(x_pair, y_pair))
    squared = (estimates - exact) ** 2
    root_n = np.sqrt(NUM_DRAWS)
    predicted = mse(x_pair, y_pair, NUM_FEATURES)
    print(
        f"{name:<30} {exact:8.4f} {estimates.mean():9.4f} +- {estimates.std() / root_n:.4f}"
        f" {squared.mean():9.2e} +- {squared.std() / root_n:.1e} {predicted:12.2e}"
    )

# %% [markdown]
# ## 3. Coupling matters: MSE of positive features vs the closed form
#
# For the Gaussian kernel with positive features, the MSE of every coupling has a closed form
# (`theory.prf_mse`, SimRF Eq. 11 with the RF-conformity of Eq. 19, 23 and 24). It depends on
# $v = \lVert x + y\rVert$. We scale a fixed pair of directions so that $v$ sweeps a range and
# plot the MSE ratio to IIDRF: theory as lines, Monte Carlo (the draws of section 1) as points
# with error bars of one standard error of the ratio (computed from the samples). SimRF <
# ORF < IIDRF, as the paper proves.

# %%
scales = np.linspace(0.2, 1.2, 4 if QUICK else 9)
direction_x = rng.standard_normal(DIM)
direction_y = rng.standard_normal(DIM)
direction_x /= np.linalg.norm(direction_x)
direction_y /= np.linalg.norm(direction_y)
xs = scales[:, None] * direction_x
ys = scales[:, None] * direction_y
v = np.linalg.norm(xs + ys, axis=-1)
exact = np.asarray(kernels.gaussian(xs, ys), np.float64)


@jax.jit
def positive_gaussian_estimates(batch: projections.Projection) -> jax.Array:
    """(NUM_DRAWS, len(scales)) positive-feature estimates of the Gaussian kernel."""
    xs32, ys32 = jnp.asarray(xs, jnp.float32), jnp.asarray(ys, jnp.float32)

    def one_draw(w):
        phi = lambda u: features.positive_features(u, w, kernel="gaussian")  # noqa: E731
        return features.estimate(phi(xs32), phi(ys32))

    return jax.vmap(one_draw)(batch)


errors = {
    c: (np.asarray(positive_gaussian_estimates(draws[c]), np.float64) - exact) ** 2
    for c in COUPLINGS
}
theory_mse = {c: theory.prf_mse(xs, ys, NUM_FEATURES, coupling=c) for c in COUPLINGS}

fig, ax = plt.subplots(figsize=(5.5, 3.8))
iid = errors["gaussian"]
for i, coupling in enumerate(COUPLINGS):
    ratio_theory = theory_mse[coupling] / theory_mse["gaussian"]
    ax.plot(v, ratio_theory, color=f"C{i}", label=f"{COUPLINGS[coupling]} theory")
    if coupling == "gaussian":
        continue
    mean, mean_iid = errors[coupling].mean(0), iid.mean(0)
    ratio = mean / mean_iid
    # Delta-method standard error of a ratio of two independent means.
    se = (
        ratio * np.hypot(errors[coupling].std(0) / mean, iid.std(0) / mean_iid) / np.sqrt(NUM_DRAWS)
    )
    ax.errorbar(v, ratio, yerr=se, fmt="o", color=f"C{i}", label=f"{COUPLINGS[coupling]} MC")
ax.set_xlabel(r"$v = \|x + y\|$")
ax.set_ylabel("MSE / MSE(IIDRF)")
ax.set_title(f"Gaussian kernel, positive features, d = {DIM}, m = {NUM_FEATURES}")
ax.legend(fontsize=8)
plt.show()

for coupling in COUPLINGS:
    z = (errors[coupling].mean(0) - theory_mse[coupling]) / (
        errors[coupling].std(0) / np.sqrt(NUM_DRAWS)
    )
    print(f"{coupling:>10}: MC vs theory, z-scores {np.array2string(z, precision=1)}")

# %% [markdown]
# The z-scores measure the Monte Carlo MSE against the closed form in standard errors; they
# should lie within a few units (the points share their draws, so neighbours move together).
#
# **Where next:** `simrf_attention.ipynb` puts the couplings into Performer attention and
# `hybrid_features.ipynb` mixes feature maps into hybrid estimators.
