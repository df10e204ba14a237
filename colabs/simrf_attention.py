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
# # SimRF vs ORF vs IID in Performer attention
#
# A Performer replaces softmax attention $\mathrm{softmax}(QK^\top/\sqrt{H})V$ by linear
# attention over positive random features (FAVOR+): each score $\exp(q^\top k/\sqrt{H})$ is
# estimated by $\phi(q)^\top\phi(k)$ with $m$ random projections. How the projections are
# coupled changes the variance of every score and hence the error of the attention output.
# The Simplex Random Features paper (Reid et al. 2023, arXiv:2301.13856, Sec. 5.4) shows
# SimRF < ORF < IIDRF.
#
# Here we measure the error of `rfjax.attention.favor_attention` against the exact
# `softmax_attention` over many independent draws of the projection, per coupling, as the number
# of features $m$ grows. Set `RFJAX_COLAB_QUICK=1` for a seconds-long run with small sizes.

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

from rfjax import attention, nn, projections

HEAD_DIM = 8 if QUICK else 16  # H
LENGTH = 32 if QUICK else 256  # T, tokens
NUM_DRAWS = 500 if QUICK else 2000  # independent projections per coupling
CHUNK = 100  # draws evaluated together
FEATURE_COUNTS = (8, 16) if QUICK else (16, 32, 64, 128, 256)  # m, multiples of H
COUPLINGS = {"gaussian": "IIDRF", "orthogonal": "ORF", "simplex": "SimRF"}
print(f"quick={QUICK}, H={HEAD_DIM}, T={LENGTH}, draws={NUM_DRAWS}, m in {FEATURE_COUNTS}")

# %% [markdown]
# ## Inputs
#
# One batch, one head, in the `(B, T, N, H)` layout of `jax.nn.dot_product_attention`. Queries
# and keys have moderate norms ($\lVert q\rVert H^{-1/4} \approx 0.35\, H^{1/4}$, 0.7 at
# $H = 16$), as in trained Performers; the variance of every positive random-feature estimate of
# $e^{q^\top k}$ grows exponentially with the norms.

# %%
key_q, key_k, key_v = jax.random.split(jax.random.key(0), 3)
shape = (1, LENGTH, 1, HEAD_DIM)
query = 0.35 * jax.random.normal(key_q, shape)
key = 0.35 * jax.random.normal(key_k, shape)
value = jax.random.normal(key_v, shape)
exact = attention.softmax_attention(query, key, value)
print("exact output:", exact.shape)

# %% [markdown]
# ## Error over draws
#
# `attention.draw_projection(key, H, m, coupling=...)` draws one projection by coupling name.
# A batch of `NUM_DRAWS` independent projections is one `jax.vmap` over keys; the attention over
# that batch is vmapped over chunks of `CHUNK` draws (`jax.lax.map(..., batch_size=CHUNK)`).
# Every $m$ here is a multiple of $H$, so the first $m$ rows of a draw of $m_{\max}$ rows are
# whole independent blocks: a draw of $m$ rows of the same coupling. We draw once at
# $m_{\max}$ and truncate, which keeps the run short.


# %%
def draw_batch(coupling: str, key: jax.Array) -> projections.Projection:
    """NUM_DRAWS independent projections of max(FEATURE_COUNTS) rows (a batched pytree)."""
    keys = jax.random.split(key, NUM_DRAWS)
    return jax.vmap(
        lambda k: attention.draw_projection(k, HEAD_DIM, max(FEATURE_COUNTS), coupling=coupling)
    )(keys)


def first_rows(batch: projections.Projection, num_features: int) -> projections.Projection:
    """The first num_features rows of every draw (whole blocks of H rows)."""
    weights = batch.matrix()[:, :num_features]
    return projections.DenseProjection(weights, block_size=batch.block_size)


@jax.jit
def relative_errors(batch: projections.Projection) -> jax.Array:
    """|favor - exact| / |exact| (Frobenius) for every draw of the batch."""

    def one_draw(projection):
        out = attention.favor_attention(query, key, value, projection)
        return jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact)

    # lax.map over chunks of draws, vmapped within a chunk: bounded memory at full size.
    return jax.lax.map(one_draw, batch, batch_size=CHUNK)


errors = {}  # (coupling, m) -> (NUM_DRAWS,) relative errors
for i, coupling in enumerate(COUPLINGS):
    batch = draw_batch(coupling, jax.random.key(1 + i))
    for m in FEATURE_COUNTS:
        errors[coupling, m] = np.asarray(relative_errors(first_rows(batch, m)), np.float64)

print(f"{'m':>5} " + " ".join(f"{COUPLINGS[c]:>18}" for c in COUPLINGS))
for m in FEATURE_COUNTS:
    cells = []
    for c in COUPLINGS:
        e = errors[c, m]
        cells.append(f"{e.mean():.4f} +- {e.std(ddof=1) / np.sqrt(e.size):.4f}")
    print(f"{m:>5} " + " ".join(f"{cell:>18}" for cell in cells))

# %% [markdown]
# The mean relative error falls like $1/\sqrt{m}$ for every coupling (the dashed guide); the
# couplings shift the constant. Error bars: one standard error over draws.

# %%
fig, (ax, ax_ratio) = plt.subplots(1, 2, figsize=(10, 3.8))
for i, coupling in enumerate(COUPLINGS):
    means = np.array([errors[coupling, m].mean() for m in FEATURE_COUNTS])
    ses = np.array([errors[coupling, m].std(ddof=1) / np.sqrt(NUM_DRAWS) for m in FEATURE_COUNTS])
    ax.errorbar(FEATURE_COUNTS, means, yerr=ses, fmt="o-", color=f"C{i}", label=COUPLINGS[coupling])
    iid = np.array([errors["gaussian", m].mean() for m in FEATURE_COUNTS])
    ax_ratio.plot(FEATURE_COUNTS, means / iid, "o-", color=f"C{i}", label=COUPLINGS[coupling])
first = np.mean([errors[c, FEATURE_COUNTS[0]].mean() for c in COUPLINGS])
guide = first * np.sqrt(FEATURE_COUNTS[0] / np.asarray(FEATURE_COUNTS))
ax.plot(FEATURE_COUNTS, guide, "k--", lw=1, label=r"$\propto 1/\sqrt{m}$")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("number of features m")
ax.set_ylabel("relative error of the output")
ax.legend(fontsize=8)
ax_ratio.set_xscale("log", base=2)
ax_ratio.set_xlabel("number of features m")
ax_ratio.set_ylabel("error / error(IIDRF)")
ax_ratio.legend(fontsize=8)
fig.suptitle(f"FAVOR+ vs exact softmax attention, H = {HEAD_DIM}, T = {LENGTH}")
plt.show()

# %% [markdown]
# Differences between couplings in units of their standard error (independent draws): a value
# above about 3 is a difference the run resolves. With `QUICK` the draws are few, so expect
# small values.

# %%
for m in FEATURE_COUNTS:
    z = []
    for worse, better in (("gaussian", "orthogonal"), ("orthogonal", "simplex")):
        a, b = errors[worse, m], errors[better, m]
        se = np.hypot(a.std(ddof=1), b.std(ddof=1)) / np.sqrt(NUM_DRAWS)
        z.append(f"{COUPLINGS[worse]} - {COUPLINGS[better]}: {(a.mean() - b.mean()) / se:+.1f} SE")
    print(f"m = {m:>4}: " + ", ".join(z))

# %% [markdown]
# ## The same in a Flax layer
#
# `rfjax.nn.PerformerAttention` is a drop-in for `flax.linen.MultiHeadDotProductAttention`
# with a `coupling` attribute. The projection is drawn from the RNG stream `"projection"` and
# redrawn every `redraw_interval` steps of the explicit `projection_step`. With the same
# parameters, the exact and Performer kinds differ by the random-feature error only.

# %%
width, heads = 2 * HEAD_DIM, 2
inputs = 0.5 * jax.random.normal(jax.random.key(7), (1, 8 if QUICK else 64, width))
performer = nn.PerformerAttention(num_heads=heads, coupling="simplex", num_features=2 * HEAD_DIM)
params = performer.init(jax.random.key(8), inputs)
rngs = {"projection": jax.random.key(9)}
out_performer = performer.apply(params, inputs, rngs=rngs, projection_step=0)
out_exact = nn.PerformerAttention(num_heads=heads, attention_kind="exact").apply(params, inputs)
gap = jnp.linalg.norm(out_performer - out_exact) / jnp.linalg.norm(out_exact)
print(f"output {out_performer.shape}, relative gap performer vs exact: {float(gap):.3f}")
