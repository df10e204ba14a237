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
# # Hybrid random features for the softmax kernel
#
# The softmax kernel $\mathrm{SM}(x, y) = e^{x^\top y}$ has two classic unbiased random-feature
# estimators, and each is accurate where the other is not (Choromanski et al. 2022, "Hybrid
# Random Features", arXiv:2110.04367):
#
# * **positive** features $e^{w^\top x - \lVert x\rVert^2/2}$ (FAVOR+), with antithetic pairs
#   $\pm w$ exact at $y = -x$: small errors for **large angles** $\theta$ between $x$ and $y$;
# * **trigonometric** features $e^{\lVert x\rVert^2/2}[\sin w^\top x, \cos w^\top x]$, exact at
#   $y = x$: small errors for **small angles**.
#
# A **hybrid** estimator mixes them with a data-dependent coefficient $\hat\lambda(x, y)$,
# itself estimated by random features, and stays a dot product of features (Lemma 2.3), so it
# still fits linear attention. This notebook measures the relative error of each estimator
# against the exact kernel (`rfjax.kernels.softmax`) across angles, compares it with the closed
# forms of `rfjax.theory`, and ends with complex-exponential and cluster-adapted hybrids.
# Set `RFJAX_COLAB_QUICK=1` for a seconds-long run with small sizes.

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

DIM = 8  # d
RADIUS = 1.0  # inputs on the sphere of radius r
NUM_FEATURES = 8  # m projections per base estimator
NUM_SIGNS = 8  # n projections of the angular coefficient
NUM_DRAWS = 500 if QUICK else 20_000
CHUNK = 500  # draws evaluated together
angles = np.linspace(0.0, np.pi, 7 if QUICK else 25)
print(f"quick={QUICK}, d={DIM}, r={RADIUS}, m={NUM_FEATURES}, n={NUM_SIGNS}, draws={NUM_DRAWS}")

# %% [markdown]
# ## Pairs on the sphere
#
# For each angle $\theta$ a pair $x, y$ with $\lVert x\rVert = \lVert y\rVert = r$ at angle
# $\theta$. The HRF error theory is for i.i.d. projections, so every projection below comes from
# `projections.gaussian`; a batch of independent draws is a `jax.vmap` over keys, and the
# estimators run over it in vmapped chunks of `CHUNK` draws (`jax.lax.map`).

# %%
rng = np.random.default_rng(0)
basis, _ = np.linalg.qr(rng.standard_normal((DIM, 2)))  # two orthonormal directions
xs = RADIUS * np.broadcast_to(basis[:, 0], (angles.size, DIM))
ys = RADIUS * (np.cos(angles)[:, None] * basis[:, 0] + np.sin(angles)[:, None] * basis[:, 1])
exact = np.asarray(kernels.softmax(xs, ys), np.float64)
xs32, ys32 = jnp.asarray(xs, jnp.float32), jnp.asarray(ys, jnp.float32)


def draw_batch(key: jax.Array, num_features: int) -> projections.Projection:
    """NUM_DRAWS independent i.i.d. Gaussian projections (a batched pytree)."""
    keys = jax.random.split(key, NUM_DRAWS)
    return jax.vmap(lambda k: projections.gaussian(k, DIM, num_features))(keys)


base_draws = draw_batch(jax.random.key(0), NUM_FEATURES)  # w: shared by both base estimators
sign_draws = draw_batch(jax.random.key(1), NUM_SIGNS)  # tau: independent of w
bandwidth = RADIUS  # tau of the Gaussian hybrid's coefficient

# %% [markdown]
# ## Five estimators
#
# Each maps one draw to the estimates for all pairs. The hybrids are asymmetric: query features
# of $x$ dotted with key features of $y$. `angular_hybrid_features` takes the positive and the
# trigonometric projection separately; passing the same one twice is variant II of Theorem 3.1
# (the same error as variant I for equal norms). `gaussian_hybrid_features` replaces the angular
# coefficient by a normalised Gaussian one (HRF Eq. 20), estimated with Fourier features.


# %%
def symmetric(feature_map):
    """Estimates phi(x).phi(y) of a symmetric feature map (a function of x and a projection)."""
    return lambda w, tau: features.estimate(feature_map(xs32, w), feature_map(ys32, w))


def asymmetric(feature_map):
    """Estimates query(x).key(y) of an asymmetric map (a function of x, w, tau and side)."""
    return lambda w, tau: features.estimate(
        feature_map(xs32, w, tau, side="query"), feature_map(ys32, w, tau, side="key")
    )


ESTIMATORS = {
    "positive": symmetric(features.positive_features),
    "positive antithetic": symmetric(
        lambda x, w: features.positive_features(x, w, antithetic=True)
    ),
    "trigonometric": symmetric(features.trigonometric_features),
    "angular hybrid": asymmetric(
        lambda x, w, tau, side: features.angular_hybrid_features(x, w, w, tau, side=side)
    ),
    "Gaussian hybrid": asymmetric(
        lambda x, w, tau, side: features.gaussian_hybrid_features(
            x, w, w, tau, side=side, bandwidth=bandwidth, radius=RADIUS
        )
    ),
}


@jax.jit
def all_estimates(w: projections.Projection, tau: projections.Projection) -> dict:
    """{estimator: (NUM_DRAWS, len(angles)) estimates} over the batched draws."""
    # lax.map over chunks of draws, vmapped within a chunk: bounded memory at full size.
    return jax.lax.map(
        lambda pair: {k: f(*pair) for k, f in ESTIMATORS.items()}, (w, tau), batch_size=CHUNK
    )


batched = all_estimates(base_draws, sign_draws)
estimates = {k: np.asarray(batched[k], np.float64) for k in ESTIMATORS}
relative_error = {
    k: np.sqrt(np.mean((v - exact) ** 2, axis=0)) / exact for k, v in estimates.items()
}
for name, values in estimates.items():
    se = values.std(0) / np.sqrt(NUM_DRAWS)
    varies = se > 1e-5 * exact  # leave out zero-variance points (exact up to float32 rounding)
    z = (values.mean(0) - exact)[varies] / se[varies]
    print(f"{name:>20}: (mean - exact) / SE over angles in [{z.min():+.1f}, {z.max():+.1f}]")

# %% [markdown]
# All five are unbiased: the mean minus the exact kernel stays within a few standard errors
# (angles where an estimator has zero variance are left out). Now the closed forms of their MSE:
#
# | estimator | `rfjax.theory` |
# |---|---|
# | positive | `prf_mse(x, y, m, kernel="softmax")` |
# | positive antithetic | `positive_antithetic_mse(x, y, m)` |
# | trigonometric | `trigonometric_mse(x, y, m)` |
# | angular hybrid | `angular_hybrid_mse(x, y, m, n, variant="shared")` |
#
# (no closed form is offered for the Gaussian hybrid: its coefficient is a reconstruction,
# docs/maths/hybrid.md, Eq. 20).

# %%
mse_theory = {
    "positive": theory.prf_mse(xs, ys, NUM_FEATURES, kernel="softmax"),
    "positive antithetic": theory.positive_antithetic_mse(xs, ys, NUM_FEATURES),
    "trigonometric": theory.trigonometric_mse(xs, ys, NUM_FEATURES),
    "angular hybrid": theory.angular_hybrid_mse(xs, ys, NUM_FEATURES, NUM_SIGNS, variant="shared"),
}
# On the sphere the relative errors also have per-angle closed forms (HRF Lemma 3.4, Thm 3.5).
sphere = {
    "positive antithetic": theory.positive_relative_error(angles, RADIUS, NUM_FEATURES),
    "trigonometric": theory.trigonometric_relative_error(angles, RADIUS, NUM_FEATURES),
    "angular hybrid": theory.angular_hybrid_relative_error(angles, RADIUS, NUM_FEATURES, NUM_SIGNS),
}
for name, values in sphere.items():
    gap = np.max(np.abs(values - np.sqrt(mse_theory[name]) / exact))
    print(f"{name:>20}: sphere formula vs sqrt(MSE)/SM, max difference {gap:.1e}")

fig, ax = plt.subplots(figsize=(6.5, 4))
for i, name in enumerate(ESTIMATORS):
    ax.plot(angles, relative_error[name], "o", color=f"C{i}", ms=4, label=f"{name} (MC)")
    if name in mse_theory:
        ax.plot(angles, np.sqrt(mse_theory[name]) / exact, "-", color=f"C{i}", lw=1)
ax.set_xlabel(r"angle $\theta$ between $x$ and $y$")
ax.set_ylabel(r"relative error $\sqrt{\mathrm{MSE}}\,/\,\mathrm{SM}(x, y)$")
ax.set_yscale("symlog", linthresh=1e-3)
ax.set_title(f"softmax kernel on the sphere r = {RADIUS}, d = {DIM}, m = {NUM_FEATURES}")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# Lines: closed forms; points: Monte Carlo. Which estimator wins where:

# %%
print(f"{'theta':>6} " + " ".join(f"{name:>20}" for name in ESTIMATORS) + "   best")
for j, theta in enumerate(angles):
    row = {name: relative_error[name][j] for name in ESTIMATORS}
    best = [name for name, error in row.items() if error <= min(row.values()) + 1e-6]
    print(f"{theta:6.2f} " + " ".join(f"{e:20.4f}" for e in row.values()) + f"   {', '.join(best)}")

# %% [markdown]
# Trigonometric features win at small angles, antithetic positive features at large ones. The
# angular hybrid is exact at both ends, and its worst relative error over all angles is far
# below the worst error of either base estimator (the max-relative-error criterion of HRF
# Sec. 3):

# %%
for name in ESTIMATORS:
    print(f"{name:>20}: max relative error over angles {relative_error[name].max():.3f}")

# %% [markdown]
# Hybrids pay for this with width: the angular hybrid has $(2m + 2m)(n + 1)$ features against
# $2m$ for the antithetic and trigonometric maps.
#
# ## Lemma 2.3: a hybrid is one dot product
#
# `hybrid_estimate` mixes base estimates with coefficient estimates (Eq. 8);
# `angular_hybrid_features` produces the same number as one dot product of query and key
# features. Check it on one draw:

# %%
w = jax.tree.map(lambda leaf: leaf[0], base_draws)
tau = jax.tree.map(lambda leaf: leaf[0], sign_draws)
positive = features.estimate(
    features.positive_features(xs32, w, antithetic=True),
    features.positive_features(ys32, w, antithetic=True),
)
trigonometric = features.estimate(
    features.trigonometric_features(xs32, w), features.trigonometric_features(ys32, w)
)
# lambda-hat = 1/2 - (1/2n) sum_l sgn(tau_l.x) sgn(tau_l.y), unbiased for theta / pi.
coefficient = 0.5 - 0.5 * features.estimate(
    features.angular_features(xs32, tau), features.angular_features(ys32, tau)
)
mixed = features.hybrid_estimate([positive, trigonometric], [coefficient])
query = features.angular_hybrid_features(xs32, w, w, tau, side="query")
key = features.angular_hybrid_features(ys32, w, w, tau, side="key")
print("feature width:", query.shape[-1])
print("max |hybrid_estimate - query.key|:", float(jnp.max(jnp.abs(mixed - (query * key).sum(-1)))))

# %% [markdown]
# ## Complex-exponential and cluster-adapted hybrids
#
# Complex-exponential (CE) features with an invertible matrix $A$ (query side $A$, key side
# $A^{-\top}$) estimate $\mathrm{SM}$ without bias, with zero variance where
# $Ax + A^{-\top}y = 0$ (HRF Eq. 17). `cluster_adapted_diagonals` solves this for a diagonal
# complex $A$ given one query point and one key point. Here we adapt $A$ to the pair at
# $\theta \approx 2\pi/3$ and compare the Monte Carlo MSE at every angle with
# `theory.complex_exponential_mse`.

# %%
target = int(np.argmin(np.abs(angles - 2 * np.pi / 3)))
alpha = features.cluster_adapted_diagonals(
    xs32[target : target + 1], ys32[target : target + 1], matrix="complex"
)[0, 0]
residual = np.abs(np.asarray(alpha) * xs[target] + ys[target] / np.asarray(alpha)).max()
print(f"adapted to theta = {angles[target]:.2f}: max |A x + A^-T y| = {residual:.1e}")


@jax.jit
def ce_estimates(batch: projections.Projection) -> jax.Array:
    """(NUM_DRAWS, len(angles)) CE estimates with A = diag(alpha)."""

    def one_draw(w):
        query = features.complex_exponential_features(xs32, w, alpha, side="query")
        key = features.complex_exponential_features(ys32, w, alpha, side="key")
        return features.estimate(query, key)

    return jax.lax.map(one_draw, batch, batch_size=CHUNK)


ce_mse = np.mean((np.asarray(ce_estimates(base_draws), np.float64) - exact) ** 2, axis=0)
ce_theory = theory.complex_exponential_mse(xs, ys, np.asarray(alpha), NUM_FEATURES)
print(f"{'theta':>6} {'MSE (MC)':>10} {'MSE (theory)':>12}")
for theta, measured, predicted in zip(angles, ce_mse, ce_theory, strict=True):
    print(f"{theta:6.2f} {measured:10.2e} {predicted:12.2e}")

# %% [markdown]
# Exact at the adapted pair, accurate near it, and far worse than positive or trigonometric
# features away from it: the MSE grows like $e^{\lVert Ax + A^{-\top}y\rVert^2}$. There the
# estimator is heavy-tailed, so a Monte Carlo with few draws underestimates the MSE (it agrees
# with the closed form only where the MSE is moderate). Hence the cluster-adapted hybrid below
# uses each CE estimator only near the pair of centres it is adapted to.
#
# The cluster-adapted hybrid generalises this to data: it fits k-means centres to queries and
# to keys and picks, per pair of clusters, the diagonal $A$ that is exact at that pair of
# centres. On clustered data it beats plain positive features with the same projection. We
# compare the relative Frobenius error of the estimated Gram matrix $[\mathrm{SM}(q_i, k_j)]$
# over draws.

# %%
num_points = 32 if QUICK else 256
query_centres = 0.3 * rng.standard_normal((2, DIM))  # two clusters of queries, two of keys
key_centres = 0.3 * rng.standard_normal((2, DIM))
queries = query_centres[rng.integers(0, 2, num_points)] + 0.05 * rng.standard_normal(
    (num_points, DIM)
)
keys = key_centres[rng.integers(0, 2, num_points)] + 0.05 * rng.standard_normal((num_points, DIM))
queries32, keys32 = jnp.asarray(queries, jnp.float32), jnp.asarray(keys, jnp.float32)
gram = np.asarray(kernels.gram(kernels.softmax, queries, keys), np.float64)

parameters = features.fit_cluster_hybrid(jax.random.key(2), queries32, keys32, 2, 2)
print(
    f"clusters: {parameters.num_query_clusters} of queries, {parameters.num_key_clusters} of keys"
)


@jax.jit
def gram_errors(batch: projections.Projection) -> dict:
    """Relative Frobenius error of the estimated Gram matrix, per draw."""

    def one_draw(w):
        cluster = features.cluster_hybrid_features(queries32, w, parameters, side="query")
        cluster_keys = features.cluster_hybrid_features(keys32, w, parameters, side="key")
        grams = {
            "positive": features.positive_features(queries32, w)
            @ features.positive_features(keys32, w).T,
            "cluster hybrid": cluster @ cluster_keys.T,
        }
        return {k: jnp.linalg.norm(g - gram) / jnp.linalg.norm(gram) for k, g in grams.items()}

    return jax.lax.map(one_draw, batch, batch_size=CHUNK)


for name, errors in gram_errors(base_draws).items():
    errors = np.asarray(errors, np.float64)
    se = errors.std(ddof=1) / np.sqrt(errors.size)
    print(f"{name:>15}: relative Gram error {errors.mean():.4f} +- {se:.4f}")
