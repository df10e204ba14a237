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
# # A Performer ViT in Flax NNX
#
# `rfjax.nn.nnx` holds Flax NNX versions of the Performer modules: `PerformerAttention`, a
# drop-in for `flax.nnx.MultiHeadAttention` (same parameters, same call), and `PerformerViT`.
# They compute FAVOR attention with the same code as the linen modules (`rfjax.attention`).
# Here we swap an `nnx.MultiHeadAttention` for a `PerformerAttention`, then train a small
# Performer ViT with `nnx.Optimizer` and optax, next to the same ViT with exact attention.
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
import optax
from flax import nnx

from rfjax.nn import nnx as rnnx

SIDE = 16  # image side
STEPS = 6 if QUICK else 400  # training steps
BATCH = 32 if QUICK else 64
TEST = 64 if QUICK else 1000  # test images
LAYERS = 1 if QUICK else 2  # encoder blocks
print(f"quick={QUICK}, steps={STEPS}, batch={BATCH}, layers={LAYERS}")

# %% [markdown]
# ## A drop-in for `nnx.MultiHeadAttention`
#
# The parameters of an `nnx.MultiHeadAttention` load into `rnnx.PerformerAttention` unchanged
# (`query`, `key`, `value`, `out`). With `attention_kind="exact"` the outputs are the same;
# the default Performer kind replaces softmax attention by FAVOR+ with `num_features` random
# features per head, redrawn from the layer's projection key by `projection_step`; its
# difference from softmax attention is the random-feature error, which falls like
# $1/\sqrt{m}$ (see the `simrf_attention` notebook).

# %%
x = jax.random.normal(jax.random.key(0), (2, 64, 32))
mha = nnx.MultiHeadAttention(4, 32, decode=False, rngs=nnx.Rngs(0))
exact = rnnx.PerformerAttention(4, 32, attention_kind="exact", rngs=nnx.Rngs(1))
performer = rnnx.PerformerAttention(4, 32, num_features=64, coupling="simplex", rngs=nnx.Rngs(1))
for layer in (exact, performer):
    nnx.update(layer, nnx.state(mha, nnx.Param))
reference = mha(x, is_causal=True)
for name, layer in (("exact", exact), ("performer", performer)):
    error = jnp.linalg.norm(layer(x, is_causal=True) - reference) / jnp.linalg.norm(reference)
    print(f"{name:9s} relative difference from nnx.MultiHeadAttention: {float(error):.2e}")

# %% [markdown]
# ## A task that needs attention
#
# Each image holds one bright horizontal or vertical bar at a random place, under noise; the
# label is its orientation. No single 4 x 4 patch decides it (a patch crossed by a bar looks
# the same in both cases unless the bar runs along it): the class token has to compare
# patches.


# %%
def bars(key, count):
    """Images (count, SIDE, SIDE) with one bar (label 0: horizontal, 1: vertical)."""
    labels = jax.random.bernoulli(key, 0.5, (count,)).astype(jnp.int32)
    where = jax.random.randint(jax.random.fold_in(key, 1), (count, 1, 1), 0, SIDE)
    rows, cols = jnp.arange(SIDE)[None, :, None], jnp.arange(SIDE)[None, None, :]
    bar = jnp.where(labels[:, None, None] == 0, rows == where, cols == where)
    noise = 0.5 * jax.random.normal(jax.random.fold_in(key, 2), (count, SIDE, SIDE))
    return bar.astype(jnp.float32) + noise, labels


test_images, test_labels = bars(jax.random.key(10**6), TEST)
fig, axes = plt.subplots(1, 6, figsize=(9, 1.8))
for ax, image, label in zip(axes, test_images, test_labels, strict=False):
    ax.imshow(image, cmap="gray")
    ax.set_title(["horizontal", "vertical"][int(label)], fontsize=8)
    ax.axis("off")
plt.show()

# %% [markdown]
# ## Training with `nnx.Optimizer`
#
# `nnx.Optimizer(model, optax.adamw(...), wrt=nnx.Param)` trains the parameters only: the
# attention layers' projection keys (`rnnx.ProjectionKey`) are state that the optimizer leaves
# alone. The train step passes its counter as `projection_step`, so the random features are
# redrawn every `redraw_interval` steps, deterministically.


# %%
def make_model(attention_kind):
    return rnnx.PerformerViT(
        2,
        image_size=(SIDE, SIDE),
        patch_size=4,
        hidden_size=32,
        num_layers=LAYERS,
        num_heads=2,
        mlp_dim=64,
        attention_kind=attention_kind,
        coupling="simplex",
        num_features=16,
        redraw_interval=50,
        rngs=nnx.Rngs(0),
    )


@nnx.jit
def train_step(model, optimizer, images, labels, step):
    def loss_fn(model):
        logits = model(images, train=True, projection_step=step)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def accuracy(model, images, labels, step):
    return jnp.mean(jnp.argmax(model(images, projection_step=step), axis=-1) == labels)


histories = {}
for kind in ("performer", "exact"):
    model = make_model(kind)
    optimizer = nnx.Optimizer(model, optax.adamw(2e-3), wrt=nnx.Param)
    losses = []
    for step in range(STEPS):
        images, labels = bars(jax.random.fold_in(jax.random.key(1), step), BATCH)
        losses.append(float(train_step(model, optimizer, images, labels, step)))
    histories[kind] = losses
    test_accuracy = float(accuracy(model, test_images, test_labels, STEPS))
    print(
        f"{kind:9s} loss {np.mean(losses[:10]):.3f} (first 10 steps) -> "
        f"{np.mean(losses[-10:]):.3f} (last 10); test accuracy {test_accuracy:.3f} on {TEST}"
    )

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for kind, losses in histories.items():
    ax.plot(np.arange(1, STEPS + 1), losses, label=kind, alpha=0.8)
ax.set_xlabel("step")
ax.set_ylabel("training loss (one batch)")
ax.legend()
plt.show()
