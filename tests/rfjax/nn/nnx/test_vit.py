"""Tests of ``rfjax.nn.nnx._vit``: the NNX PerformerViT trains with an NNX optimizer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rfjax.nn import nnx as rnnx


def _bright_or_dark(key, count):
    """Images 8 x 8 whose mean is +0.5 (label 1) or -0.5 (label 0), under N(0, 1) noise."""
    labels = jax.random.bernoulli(key, 0.5, (count,)).astype(jnp.int32)
    noise = jax.random.normal(jax.random.fold_in(key, 1), (count, 8, 8))
    return noise + (labels[:, None, None] - 0.5), labels


STEPS = 16


def test_vit_trains_with_nnx_optimizer():
    """A few Adam steps on a fixed batch of a separable task lower the loss; projections are
    redrawn by the step (redraw_interval=4) inside nnx.jit."""
    vit = rnnx.PerformerViT(
        2,
        image_size=(8, 8),
        patch_size=4,
        hidden_size=8,
        num_layers=1,
        num_heads=2,
        mlp_dim=16,
        num_features=8,
        redraw_interval=4,
        rngs=nnx.Rngs(0),
    )
    optimizer = nnx.Optimizer(vit, optax.adam(1e-2), wrt=nnx.Param)
    images, labels = _bright_or_dark(jax.random.key(1), 32)
    keys_before = nnx.state(vit, rnnx.ProjectionKey)

    @nnx.jit
    def train_step(model, optimizer, step):
        def loss_fn(model):
            logits = model(images, train=True, projection_step=step)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(train_step(vit, optimizer, step)) for step in range(STEPS)]
    assert losses[0] == pytest.approx(np.log(2), rel=1e-4)  # zero-initialised head
    assert np.mean(losses[-4:]) < 0.5 * losses[0], losses
    assert int(optimizer.step[...]) == STEPS
    keys_after = nnx.state(vit, rnnx.ProjectionKey)  # not trained
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), keys_before, keys_after))
