"""A study refuses a config whose cell-keying tuple repeats an entry: the repeated cell would be
measured twice (or once and shown twice) and counted twice by a pooled test, a narrower interval
with no new evidence. Each study's default config with the field's first entry repeated."""

import importlib

import pytest

# (study, field): the tuples whose entries key a study's cells or arms.
FIELDS = [
    ("conformer_ctc", "attentions"),
    ("conformity", "norms_of_sum"),
    *(
        ("estimator_zoo", field)
        for field in (
            "feature_maps",
            "couplings",
            "real_feature_maps",
            "real_couplings",
            "norms",
            "cosines",
            "uci_sets",
            "ratios.scales",
            "ratios.anisotropies",
            "ratios.mc_scales",
        )
    ),
    ("gram_error", "couplings"),
    ("gram_error", "features_per_dim"),
    ("hrf_clustered", "feature_counts"),
    ("hrf_clustered", "point_norms"),
    ("hrf_pointwise", "radii"),
    ("hrf_qmc", "datasets"),
    ("hrf_qmc", "matchings"),
    ("hrf_qmc", "methods"),
    ("iap_es", "kinds"),
    ("kernel_mse", "couplings"),
    ("kernel_mse", "norms_of_sum"),
    ("lstm_lm", "arms"),
    ("lstm_lm", "hybrid_estimators"),
    ("performer_lm", "attention_kinds"),
    ("performer_vit", "attentions"),
    ("performer_vit", "protocols"),
    ("performer_vit", "reference_attentions"),
    ("performer_vit_maps", "feature_maps"),  # its vit's attentions are set per map
    ("rff_error", "embedding_dims"),
    ("rff_error", "distances"),
    ("structured_concentration", "families"),
    ("structured_concentration", "preprocess"),
    ("structured_concentration", "chi_contrast.dims"),
    ("structured_kernels", "methods"),
    *(
        ("uci_classification", field)
        for field in (
            "datasets",
            "couplings",
            "ratios",
            "approach_couplings",
            "approach_ratios",
            "extra_ratios",
            "fast_couplings",
            "fast_ratios",
            "table2_splits",
        )
    ),
]


@pytest.mark.parametrize(("study", "field"), FIELDS)
def test_a_repeated_entry_is_refused_naming_the_field(study, field):
    config = importlib.import_module(f"configs.{study}").get_config()
    validate = importlib.import_module(f"experiments.{study}").validate_config
    validate(config)  # the default config passes
    *parents, leaf = field.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    entries = tuple(node[leaf])
    assert entries, f"{study}'s default {field} is empty: nothing to repeat"
    node[leaf] = (*entries, entries[0])
    with pytest.raises(ValueError, match=rf"config\.{field} must be without repeats"):
        validate(config)
