"""The estimators' metrics on a trained model: proposal FLOPs, the distribution metrics of
the sampled-softmax estimates over draws and the proposal diagnostic.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.core import (
    cost,
)
from experiments.lstm_lm.metrics import distribution_metrics, proposal_divergence
from experiments.lstm_lm.task import competitors, divergence_curve, estimator_options
from rfjax.sampled_softmax import (
    SAMPLERS,
    clipped_log_probabilities,
    normalize_for_proposal,
    proposal_estimates,
    proposal_features,
    sample_from_features,
)


def proposal_flops(config: ml_collections.ConfigDict, estimator: str, vocab_size: int) -> dict:
    """XLA-measured FLOPs (compiled cost analysis) of one training step's proposal for its B T
    queries: ``construct``, the features of the queries and of the vocabulary (what the HRF
    paper matched: "the similar number of FLOPS needed to construct their corresponding random
    features"), and the whole proposal (the features, then the draws) with each sampler."""
    options = estimator_options(config, estimator)
    proposal = options.pop("proposal")
    count = config.train.batch_size * config.bptt
    shapes = (
        jax.random.key(0),
        jnp.zeros((count, config.model.hidden_size)),
        jnp.zeros((vocab_size, config.model.hidden_size)),
    )

    def features(key, queries, embeddings):
        return proposal_features(
            key,
            queries,
            embeddings,
            proposal=proposal,
            temperature=jnp.float32(config.tau),
            **options,
        )

    def draw(key, q, e, sampler):
        query_features, class_features = features(key, q, e)
        return sample_from_features(
            key,
            query_features,
            class_features,
            config.sampler.num_samples,
            sampler=sampler,
            uniform_floor=config.sampler.uniform_floor,
        )

    return {
        "construct": cost.compiled_flops(features, *shapes),
        **{
            name: cost.compiled_flops(functools.partial(draw, sampler=name), *shapes)
            for name in SAMPLERS
        },
    }


def _metric_draws(config: ml_collections.ConfigDict, estimator: str, temperature: float):
    """A jitted ``(keys, queries, table, probabilities) -> {metric: (draws, queries)}``: the
    distribution metrics of ``estimator``'s estimate of every query's kernel softmax, one
    feature draw per key, queries in chunks of ``config.metric_query_chunk``."""
    options = estimator_options(config, estimator)
    chunk = config.metric_query_chunk

    # Arrays enter as arguments, not closure constants (XLA would constant-fold them).
    @jax.jit
    def draws(keys, queries, table, probabilities):
        def one_draw(key):
            def one_chunk(args):
                rows, target = args
                estimates = proposal_estimates(key, rows, table, temperature=temperature, **options)
                return distribution_metrics(target, estimates)

            blocks = jax.lax.map(
                one_chunk,
                (
                    queries.reshape(-1, chunk, queries.shape[-1]),
                    probabilities.reshape(-1, chunk, probabilities.shape[-1]),
                ),
            )
            return {name: value.reshape(-1) for name, value in blocks.items()}

        return jax.lax.map(one_draw, keys)

    return draws


def _summary_row(values: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean, median and the SE over queries (of each query's mean over draws) of every metric
    of ``values`` (``(draws, queries)`` arrays)."""
    row = {}
    for name, value in values.items():
        per_query = value.mean(axis=0)
        row[f"{name}_mean"] = float(value.mean())
        row[f"{name}_median"] = float(np.median(value))
        row[f"{name}_se"] = float(per_query.std(ddof=1) / np.sqrt(per_query.size))
    return row


def model_metrics(
    model, params, inputs: np.ndarray, temperature: float, config, key: jax.Array
) -> tuple[list[dict], list[dict]]:
    """The distribution metrics of every estimator on one model (module docstring): per
    estimator a ``_summary_row`` (``uniform``: the flat estimate), and per hybrid and
    competitor the paired difference competitor - hybrid of W1 and KS over the same queries
    and draws (mean and SE over queries)."""
    queries, table = model.apply(params, inputs, train=False)
    queries = queries.reshape(-1, queries.shape[-1])[: config.num_metric_queries]
    probabilities = jax.nn.softmax(
        normalize_for_proposal(queries, temperature) @ normalize_for_proposal(table, temperature).T,
        axis=-1,
    )
    uniform = distribution_metrics(probabilities, jnp.ones_like(probabilities))
    values = {"uniform": {name: np.asarray(value)[None] for name, value in uniform.items()}}
    keys = jax.random.split(key, config.num_metric_draws)  # shared: paired by draw
    for estimator in config.estimators:
        draws = _metric_draws(config, estimator, temperature)
        computed = draws(keys, queries, table, probabilities)
        values[estimator] = {name: np.asarray(value) for name, value in computed.items()}
    scored = [{"estimator": name, **_summary_row(v)} for name, v in values.items()]
    pairs = []
    hybrids = [name for name in config.estimators if name not in competitors(config)]
    for hybrid in hybrids:
        for competitor in competitors(config):
            for metric in ("wasserstein", "ks"):
                difference = values[competitor][metric].mean(0) - values[hybrid][metric].mean(0)
                pairs.append(
                    {
                        "hybrid": hybrid,
                        "competitor": competitor,
                        "metric": metric,
                        "difference": float(difference.mean()),
                        "se": float(difference.std(ddof=1) / np.sqrt(difference.size)),
                    }
                )
    return scored, pairs


def proposal_diagnostic(
    model, params, inputs: np.ndarray, heldout: np.ndarray, tau: float, config, key: jax.Array
) -> dict:
    """Every proposal as an importance sampler for the model's softmax, at the proposal's tau
    and at the held-out-KL tau: mean over ``num_diagnostic_queries`` queries and
    ``num_diagnostic_draws`` draws of KL(model softmax || proposal) (the clipped sampler's
    proposal with its floor; ``kernel``: the kernel softmax itself; ``uniform``: 1/V), the
    fraction of negative estimates and the W1 of the clipped estimate against the kernel
    softmax. Returns the held-out divergence curve, the selected tau and the rows."""
    curve = np.asarray(divergence_curve(model, params, heldout, config.tau_grid))
    tau_kl = float(config.tau_grid[int(np.argmin(curve))])
    queries, table = model.apply(params, inputs, train=False)
    queries = queries.reshape(-1, queries.shape[-1])[: config.num_diagnostic_queries]
    log_model = jax.nn.log_softmax(queries @ table.T, axis=-1)
    rows = []
    for rule, temperature in (("proposal", tau), ("heldout_kl", tau_kl)):
        log_kernel = jax.nn.log_softmax(
            normalize_for_proposal(queries, temperature)
            @ normalize_for_proposal(table, temperature).T,
            axis=-1,
        )
        kernel = jnp.exp(log_kernel)
        uniform = jnp.full_like(log_kernel, -np.log(table.shape[0]))
        plain = {
            "uniform": (uniform, jnp.ones_like(kernel)),
            "kernel": (log_kernel, kernel),
        }
        for name, (log_q, estimate) in plain.items():
            rows.append(
                _diagnostic_row(rule, temperature, name, log_model, log_q, kernel, estimate)
            )
        keys = jax.random.split(key, config.num_diagnostic_draws)
        for estimator in config.estimators:
            options = estimator_options(config, estimator)
            per_draw = []
            for draw_key in keys:
                estimate = proposal_estimates(
                    draw_key, queries, table, temperature=temperature, **options
                )
                log_q = clipped_log_probabilities(estimate, config.sampler.uniform_floor)
                row = _diagnostic_row(
                    rule, temperature, estimator, log_model, log_q, kernel, estimate
                )
                per_draw.append(row)
            rows.append(
                {
                    **per_draw[0],
                    **{
                        name: float(np.mean([row[name] for row in per_draw]))
                        for name in ("proposal_kl", "negative_fraction", "wasserstein")
                    },
                }
            )
    return {"divergence": curve.tolist(), "tau_heldout_kl": tau_kl, "rows": rows}


def _diagnostic_row(rule, temperature, name, log_model, log_q, kernel, estimate) -> dict:
    metrics = distribution_metrics(kernel, estimate)
    return {
        "tau_rule": rule,
        "tau": float(temperature),
        "proposal": name,
        "proposal_kl": float(jnp.mean(proposal_divergence(log_model, log_q))),
        "negative_fraction": float(jnp.mean(metrics["negative_fraction"])),
        "wasserstein": float(jnp.mean(metrics["wasserstein"])),
    }
