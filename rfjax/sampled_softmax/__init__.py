"""Sampled softmax with random-feature proposals (Rawat et al. 2019; HRF Sec. 4.2, App. I).

A sampled softmax replaces the normaliser Z = sum_i exp(o_i) of the cross-entropy over a
vocabulary of V classes (logits o_i = q.e_i of a query q and class embeddings e_i) by an
importance-sampled estimate from M negatives s_1..s_M ~ Q(. | q):

  loss = log(exp(o_t) + sum_j [s_j != t] exp(o_{s_j} - log(M Q(s_j | q)))) - o_t,

where t is the target. The log-proposal correction makes the bracket an unbiased estimate of
Z = exp(o_t) + sum_{i != t} exp(o_i) for every Q with Q(i) > 0, and "accidental hits"
(negatives equal to the target) are removed (their term is dropped, not resampled), so the
loss tends to the full cross-entropy as M grows.

Proposals (``proposals()``). ``"uniform"``: Q = 1/V. ``"exact"``: Q = softmax(o), the full
softmax of the loss logits (the ideal, O(V d) per query). ``"kernel"``: the kernel softmax
below computed exactly (O(V d) per query; the limit of infinitely many random features, a
control that separates the kernel's mismatch with the model from the random-feature error). The
four random-feature proposals follow Rawat et al.: an estimate K-hat(q, e) = phi(q).psi(e) of
the softmax kernel of the *normalised* vectors with temperature tau,

  K(q, e) = exp(q_bar.e_bar / tau) = SM(q_bar / sqrt(tau), e_bar / sqrt(tau)),  u_bar = u / |u|,

so all inputs lie on the sphere of radius r = 1/sqrt(tau). Feature maps: every map registered in
``rfjax.features`` as an estimator of the softmax kernel (``feature_proposals()``), e.g.
``"positive_antithetic"`` (FAVOR+, antithetic), ``"trigonometric"``, ``"angular_hybrid"`` and
``"gaussian_hybrid"`` (HRF Eq. 12, 19, 20). tau may be a traced scalar (chosen per step, or the
model's learned temperature). Whether K is consistent with the model depends on the logits: for
cosine logits o = q_bar.e_bar / tau (Rawat et al.) the kernel softmax *is* the model's softmax;
for raw logits o = q.e the kernel softmax only approximates it, best at the tau that minimises
the divergence between the two (``select_temperature``, by ``kernel_softmax_divergence``).

Two samplers (``SAMPLERS``) turn the features a = phi(q), B[i] = psi(e_i) into a proposal:

* ``"clipped"`` (default; the HRF paper's treatment of negative estimates): the estimate over
  the whole vocabulary, clipped at zero, normalised and mixed with a uniform floor eps,

    Q(i | q) = (1 - eps) max(K-hat_i, 0) / sum_j max(K-hat_j, 0) + eps / V

  (Q = 1/V for a query whose estimates are all <= 0). It costs O(V W) per query (the N x V
  estimate matrix, as much as a full softmax of width W), and it is the distribution the
  estimator actually proposes: for positive features it is the normalised kernel estimate
  (plus the floor). The floor bounds the importance weights exp(o_i) / (M Q(i)).
* ``"decomposition"`` (fast option): the mixture

    Q(i | q) = sum_k |a_k| |B_ik| / sum_k |a_k| S_k,   S_k = sum_i |B_ik|,

  sampled in two stages without forming the estimate: a feature k with probability
  |a_k| S_k / sum_l |a_l| S_l, then a class i with probability |B_ik| / S_k by binary search in
  per-feature cumulative tables of |B| (W x V, built once per call and shared by the batch):
  O(V W) per step plus O(W + M log V) per query. For positive features it equals the normalised
  kernel estimate (Rawat et al.'s sampler). For signed features it is *not* the clipped
  estimate: the |.| discards the signs that carry the kernel's shape, and for trigonometric
  features the mixture is nearly uniform.

Both samplers return the exact log-probability of the distribution they draw from, so the
importance correction is exact for the proposal used.

The pieces: ``sample_proposal`` draws the negatives of any proposal and ``sampled_softmax_loss``
scores them; ``proposal_features``/``proposal_estimates`` give the random features and kernel
estimates of a random-feature proposal, ``sample_from_features`` samples from features with
either sampler (``feature_proposal_probabilities``, ``clipped_log_probabilities``: the
distributions themselves); ``select_temperature`` chooses tau. Everything is a function of
arrays and explicit keys (no Flax): the model that produces queries and class embeddings is the
caller's (e.g. ``rfjax.nn.LSTMLanguageModel``).

References:
  Rawat, Chen, Yu, Suresh and Kumar, "Sampled softmax with random Fourier features",
  NeurIPS 2019, arXiv:1907.10747; Choromanski et al., "Hybrid Random Features", ICLR 2022,
  arXiv:2110.04367, Sec. 4.2 and App. I; Bengio and Senecal 2008; Jean et al. 2015.
"""

from rfjax.sampled_softmax._loss import sampled_softmax_loss
from rfjax.sampled_softmax._proposal_features import (
    feature_proposals,
    normalize_for_proposal,
    proposal_estimates,
    proposal_features,
)
from rfjax.sampled_softmax._proposals import PLAIN_PROPOSALS, proposals, sample_proposal
from rfjax.sampled_softmax._samplers import (
    SAMPLERS,
    clipped_log_probabilities,
    clipped_proposal_log_probabilities,
    feature_proposal_probabilities,
    sample_from_features,
)
from rfjax.sampled_softmax._temperature import kernel_softmax_divergence, select_temperature

__all__ = [
    "PLAIN_PROPOSALS",
    "SAMPLERS",
    "clipped_log_probabilities",
    "clipped_proposal_log_probabilities",
    "feature_proposal_probabilities",
    "feature_proposals",
    "kernel_softmax_divergence",
    "normalize_for_proposal",
    "proposal_estimates",
    "proposal_features",
    "proposals",
    "sample_from_features",
    "sample_proposal",
    "sampled_softmax_loss",
    "select_temperature",
]
