"""``favor_attention``: validates its arguments and runs the bidirectional or causal kernel."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rfjax._devices import cuda_capability
from rfjax._validation import check_int
from rfjax.attention import _kernel_settings
from rfjax.attention._bidirectional import BIDIRECTIONAL_BLOCK, bidirectional_attention
from rfjax.attention._causal import causal_attention
from rfjax.attention._checks import (
    FeatureMapSpec,
    HeadAxes,
    ProjectionSpec,
    check_causal,
    check_mask,
    check_projection,
    check_qkv,
    compute_dtype,
    default_eps,
    resolve_feature_map,
    resolve_stabilize,
)
from rfjax.attention._data_fitted import fit_if_unfitted, fit_to_inputs, is_unfitted
from rfjax.attention._fused import Backend, check_fusable, fusable, fused_attention
from rfjax.attention._global_split import attend_split, bound_by_shard_map, fit_split, is_split
from rfjax.attention._head_features import has_signed_features, normalise
from rfjax.attention._implementations import TABLE as IMPLEMENTATION_TABLE
from rfjax.attention._implementations import auto_choice
from rfjax.attention._implementations import resolve as resolve_implementation
from rfjax.attention._kernel_settings import KernelSettings
from rfjax.attention._sequence_parallel import check_sequence_axis, check_split_along
from rfjax.features import FeatureMap
from rfjax.projections import Projection

# Positions per chunk of the causal prefix sums: on a 2-core CPU, 0.75-0.92x the time of the
# blocked scan before the chunk-parallel form at T = 4k and 16k (64), 0.99-1.17x (128);
# benchmarks.attention picks among sizes per case.
DEFAULT_CHUNK_SIZE = 64


def favor_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: ProjectionSpec,
    *,
    feature_map: FeatureMapSpec = "positive",
    causal: bool = False,
    mask: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    stabilize: bool | None = None,
    eps: float | None = None,
    sequence_axis: str | None = None,
    implementation: str = "auto",
) -> jax.Array:
    """FAVOR linear attention: softmax-like attention through random features in O(T m).

    For each batch b and head n, with the query and key features phi_Q, phi_K of
    ``feature_map`` applied to q' = H^{-1/4} q and k' = H^{-1/4} k (``data_normalizer``),

      out_t = sum_{j in A(t)} s_tj v_j / sum_{j in A(t)} s_tj,   s_tj = phi_Q(q_t) . phi_K(k_j),

    where A(t) is every unmasked key (bidirectional) or every unmasked key j <= t (``causal``).
    A map of the softmax kernel (``rfjax.features.available(kernel="softmax")``) makes
    phi_Q(q') . phi_K(k') an unbiased estimate of exp(q . k / sqrt(H)); with the default, the
    output approximates ``softmax_attention`` with an error that falls like 1/sqrt(m) but grows
    like exp(|q'|^2) with the scores' scale: small for |q'|^2 = |q|^2 / sqrt(H) below about 1,
    far from softmax at any practical m for |q'|^2 of 4 and more (an untrained layer's
    |q'|^2 is about sqrt(H)). The expected error against the input norm and m, from
    ``rfjax.theory.prf_mse`` and measured, and how to keep it small (normalised queries and
    keys with a small temperature, the OPRF/DERF maps): docs/maths/attention.md, "How large
    the error is, and how to keep it small". Bidirectional
    attention computes phi_Q(Q) (phi_K(K)^T [V, 1]) in blocks of ``BIDIRECTIONAL_BLOCK``
    positions (a scan over key blocks accumulating the sums, then the read-out per query block),
    in O(block (m + H_v) + m H_v) temporary memory per head for the forward pass; causal
    attention runs chunked prefix sums (a scan over chunks of ``chunk_size`` carrying
    S = sum phi_K(k_j) v_j^T and z = sum phi_K(k_j), a masked C x C quadratic form within each
    chunk), in O(T (m + H_v) + C^2) memory per head,
    and a custom VJP that recomputes chunk by chunk in reverse keeps the backward pass within the
    same bound.

    Stabiliser (on by default): the maps' log-space form (``FeatureMap.scaled_features``)
    writes phi(x) = psi(x) exp(s(x)) with a per-row log-scale s; for exponential maps
    phi = exp(l) it is s = max_i l_i, so psi's largest entry is 1; for the trigonometric map
    s = |x|^2/2 - log(m)/2 (psi = [sin, cos](W x)), and the angular and Gaussian hybrids take
    the larger of their two bases' scales. The scales are applied as shifts that cancel exactly
    in the normalised output:

    * queries: the row's own scale exp(s(q_t)) is dropped;
    * keys, bidirectional: exponential maps (phi = exp(l)) get one shift per feature,
      c_i = max_j l_i(k_j) over the unmasked keys, and each query is read out as
      exp(l_i(q_t) + c_i - M_t) with its row maximum M_t (so every row's largest term is 1, at
      any norm); other maps one constant, the maximum c of s over all unmasked keys of the
      sequence (as in the Performer code). Either is reached online: the sums carried over key
      blocks are rescaled by exp(c_old - c_new) <= 1 whenever a block raises the running
      maximum, and each key enters as psi_j exp(s(k_j) - c) (or exp(l_i(k_j) - c_i));
    * keys, causal: the running maximum c_t = max_{j <= t} s(k_j), applied online: the
      carried state (S, z) is kept relative to the running maximum and rescaled by
      exp(c_old - c_new) <= 1 when it grows (as in online softmax), and each key enters with the
      exact factor exp(s(k_j) - c_t) <= 1. Output t therefore depends only on positions <= t:
      perturbing later tokens leaves it bit-identical (the Performer's global key maximum
      would leak the future). Exponential maps (positive features, OPRF, DERF, the cluster
      hybrid) keep the running maximum per feature, c_ti = max_{j <= t} l_i(k_j), in the
      chunk-parallel form of flash-linear-attention's chunk kernels with per-feature references
      (``_log_prefix``: chunk states by a short scan over chunk summaries, within a chunk
      one product relative to its start and first key, keys far above them by blocks of 16
      positions and a log-space form per pair within a block), the feature map applied
      chunk by chunk so the (T, m) features are never stored), each row read out
      relative to its largest term: at large |q|, |k| the query's largest
      features and the keys' lie in different directions, and one shift per key loses a row's
      largest terms; with ``sequence_axis`` each device combines the earlier devices'
      per-feature states (``_sequence_parallel.sequence_parallel_feature_prefix``).

    Sequence parallel (context parallel): called inside ``jax.shard_map`` with
    ``sequence_axis="seq"`` on the local shards of query, key, value and mask of a sequence split
    along its length over the mesh axis ``"seq"`` (device d of D holds positions
    [d T/D, (d+1) T/D), in_specs ``P(None, "seq")``), it returns the local shard of the output of
    the whole sequence, with O(T/D) memory per device. Bidirectional: the key sums (S, z) of the
    devices are rescaled to the global key maximum and summed (``psum``). Causal: each device
    adds the combined state of the earlier devices (an exclusive scan over the axis: one
    ``all_gather`` of the per-device (S, z) and their key maxima, and a masked sum), and its
    running key maximum starts at the earlier devices' maximum, so an output depends on no later
    position on any device. Gradients flow across devices through the collectives' transposes.
    Every device must hold the same projection and feature map (replicated, e.g. drawn from the
    same key). The axis must split the sequence: query, key, value and a given mask that do not
    vary over it (replicated) raise ``ValueError``; a shard's type does not say which dimension
    the axis splits, so inside ``shard_map`` an axis that splits the heads or the batch instead
    is caught only through the key padding mask (replicated then), and without a mask gives
    wrong outputs unnoticed. Called instead on global arrays under ``jax.set_mesh`` with
    ``sequence_axis`` an ``Explicit`` mesh axis, whose types show the split
    (``float32[B,T@seq,N,H]``), ``favor_attention`` checks it (the sequence of query, key, value
    and mask split over that axis, H not split, else ``ValueError`` naming the array and its
    split) and runs the ``shard_map`` itself, keeping a batch or head split over other axes;
    an unfitted data-fitted map is then fitted to the whole batch and sequence, as on one
    device. This is the form that cannot be misused silently.

    Data parallel: inside ``jax.shard_map`` with the batch split over a mesh axis and no
    ``sequence_axis``, each device attends within its own sequences; a projection and feature
    map passed in replicated (``P()``) get gradients summed over the devices, as JAX's own
    operations give. The fused kernels lower for Triton there; in interpret mode JAX's
    evaluator of the kernels needs ``shard_map(..., check_vma=False)``. On global arrays whose
    batch or heads are split over ``Explicit`` mesh axes (``jax.device_put`` over
    ``jax.make_mesh``'s default mesh), without ``sequence_axis``, ``favor_attention`` runs
    that ``shard_map`` itself (eagerly, or under ``jax.set_mesh`` inside ``jit``), the output
    split as the query, an unfitted data-fitted map fitted to the whole batch; a sequence split
    there raises ``ValueError`` naming the axis to pass as ``sequence_axis``.

    Each shift is a single constant for all keys of one output row (or, per feature, undone
    by the query's read-out), so it cancels between numerator and denominator; the shifts are
    constants under differentiation (stop_gradient), which keeps gradients exact. Nothing
    overflows (every exponent is <= 0); with one shift per key, keys whose scores are below
    exp(-87) (float32) of the running maximum underflow to 0, as in every stabilised
    Performer. Raw kernel estimates are not exposed here, so the stabiliser biases nothing.

    The denominator is clamped below at ``eps`` (default: the smallest normal number of the
    computation dtype), which only acts when it underflows, e.g. a query whose keys are all
    masked (or S = 0) gets an output of 0. Signed maps (trigonometric, Fourier, angular and
    Gaussian hybrids: ``needs_denominator_floor`` without exponential features) estimate a
    row's normaliser as <= 0 once their relative error nears 1 (H = 64, m = 128, random
    directions: no row up to |q| = |k| = 4, 2-4% at 6, ~43% at 8); their default ``eps`` is
    ``_checks.SIGNED_EPS`` = 1e-3 (normalisers are in units where each key's largest term is
    at most 1), which clips those rows: they are biased but finite (|output| <= |numerator| /
    eps), never NaN or inf. The normalisation's derivative is formed without den^2
    (``floored_ratio``), so gradients stay finite where the denominator is tiny.

    Non-finite inputs reach exactly the outputs that attend to them: a query, key or value
    row holding a NaN or inf is left out of every sum, and the outputs that attend to it are
    NaN: its own row for a query; for an unmasked key or value at position j, every row
    (bidirectional) or every row t >= j (causal). Masked keys and values are never read, so
    they may hold anything. Other outputs are those of the inputs without the non-finite
    rows, and gradients through them stay finite; in particular causal outputs before j are
    bit-identical whatever positions >= j hold.

    Args:
      query: ``(B, T, N, H)`` (or ``(T, N, H)``), floating.
      key: ``(B, S, N, H)``; S == T if ``causal``.
      value: ``(B, S, N, H_v)``.
      projection: a drawn ``rfjax.projections.Projection`` with ``dim == H`` and m rows, from any
        coupling, shared by all heads (``matrix()`` of shape ``(m, H)``), or a floating matrix
        W of shape ``(m, H)`` (wrapped as a ``DenseProjection``); or one per head: a
        ``PerHead`` of N draws stacked with ``jax.vmap(sampler)`` over N keys (see
        ``draw_projection``), or of an ``(N, m, H)`` array. Per-head projections cost the same
        and decorrelate the heads' errors. It is an argument, never drawn here: redraw it with
        ``redraw_key``.
      feature_map: a name from ``rfjax.features.available()`` (``"positive"``: FAVOR+,
        ``"positive_antithetic"``: width 2m, ``"relu"``: generalised attention,
        ``"trigonometric"``...), an ``rfjax.features.FeatureMap`` (with its parameters, e.g.
        ``features.get("angular_hybrid")().init(key, H)``; ``FeatureMapPair`` joins a query map
        and a key map), or a ``PerHead`` of a map with per-head parameters. Maps whose
        ``needs_denominator_floor`` is set (signed maps) can make a row's denominator <= 0:
        their default ``eps`` (1e-3, see above) clips those rows; give them bounded scores
        (unit queries and keys, as ``rfjax.nn.PerformerAttention(query_key_norm=True)`` gives
        them; the safe input ranges are in docs/maths/attention.md); with raw scores about half
        the rows can be <= 0 (``experiments/conformer_ctc/test_conformer_ctc.py``). The data-fitted
        maps (``"oprf"``, ``"derf_*"``, ``"saderf"``) given without their statistics are fitted per
        head to the current queries and keys (bidirectional; with ``sequence_axis``, those of the
        whole sequence); causal attention needs them fitted beforehand on a calibration sample (see
        ``rfjax.attention._data_fitted``).
      causal: attend only to keys j <= t.
      mask: key padding mask, bool, True = attend: ``(B, S)`` (``(S,)`` if unbatched), or
        ``(B, 1, 1, S)``, the form that broadcasts over heads and queries in
        ``jax.nn.dot_product_attention`` and Flax attention (``key_padding[:, None, None]``,
        or ``flax.linen.make_attention_mask(jnp.ones((B, 1)), key_padding, dtype=bool)``).
        Masks that depend on the query position are not key padding: use ``causal=True`` for
        the causal one; others cannot be applied by FAVOR. Masked keys contribute nothing
        (their features are zeroed).
      chunk_size: chunk length C of the causal prefix sums (clipped to T); exponential maps
        (stabilised) cut each chunk into blocks of 16 positions and round C up to a whole
        number of blocks: one (m, H_v + 1) state per chunk.
      stabilize: ``None`` (use the maps' log-space form), ``True`` (require maps that have one)
        or ``False`` (raw features).
      eps: floor of the denominator (> 0); default 1e-3 for signed maps, else the smallest
        normal number (see above).
      sequence_axis: ``None``, or the name of the mesh axis along which the sequence (axis T
        of query, key, value; axis S of mask) is split: of an enclosing ``jax.shard_map`` (the
        arrays are the local shards) or an ``Explicit`` axis of the mesh set by
        ``jax.set_mesh`` (the arrays are global, their split checked; see above).
      implementation: ``"xla"`` (the XLA form: every map, sequence parallelism, any platform),
        ``"pallas_triton"`` (fused Pallas kernels compiled by Triton, NVIDIA GPUs sm80+),
        ``"pallas_tpu"`` (the same compiled by Mosaic for TPUs), ``"pallas_mosaic_gpu"``
        (bfloat16 inputs, the affine maps with m a multiple of 64, heads of H <= 64 with
        values up to 256 wide or H <= 128 with values up to 128: kernels in Mosaic GPU's
        idiom, sm90+, for both passes of bidirectional and causal attention; causal falls back
        to the Triton kernels where its row shifts are out of reach),
        ``"pallas_triton_interpret"`` / ``"pallas_tpu_interpret"`` /
        ``"pallas_mosaic_gpu_interpret"`` (the kernels in interpret mode, any platform), or
        ``"auto"``
        (measured per platform, mode and dtype, where the kernels take the call; else
        ``"xla"``: on sm90+ GPUs the fused kernels for bidirectional bfloat16 calls, the XLA
        form for the rest, ``rfjax.attention._implementations.AUTO``). The kernels
        compute the feature map from the rows inside them (the (B, T, N, m) features never
        reach memory; their states, one per chunk of 64 rows, do, at most 128 MiB per head
        at once: longer sequences run segment by segment), for the maps with affine
        log-features ('positive', 'positive_antithetic', 'oprf') and the angular hybrid
        ('angular_hybrid', its rows in the XLA form's units, so the same rows meet the floor
        ``eps``), without
        ``sequence_axis``, stabilised; see ``rfjax.attention._implementations``.

    Returns:
      ``(B, T, N, H_v)`` (or ``(T, N, H_v)``), in the inputs' result dtype. Low-precision inputs
      (bfloat16, float16) compute their log-features, shifts and exponentials in float32; the
      causal products take operands in the inputs' dtype, accumulated in float32 (errors
      against float64 per dtype: docs/maths/attention.md, "Precision"); the angular hybrid,
      whose signed estimates cancel, takes float32 operands in both forms.
      Empty axes (B, T, N, S or H_v = 0) give the empty (or, for S = 0, all-zero) result.

    Raises:
      TypeError: for non-floating inputs, a non-bool mask, a ``projection`` that is not a
        Projection, a floating matrix or a PerHead of them, or a feature map that is not a
        name or FeatureMap.
      ValueError: for mismatched shapes, an unknown feature-map name, ``stabilize=True`` with a
        map without a log-space form, an unfitted data-fitted map with ``causal=True``,
        ``chunk_size < 1``, an input that does not vary over ``sequence_axis`` or, on global
        arrays, whose sequence it does not split; an unknown ``implementation``, one that does
        not compile for this platform, or fused kernels with a map, ``sequence_axis``,
        ``stabilize=False`` or float64 (inputs or projection) they do not take.

    Examples:
      >>> import jax
      >>> from rfjax import attention, projections
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 16, 4, 8))
      >>> w = projections.orthogonal(jax.random.key(1), 8, 64)
      >>> attention.favor_attention(q, k, v, w, causal=True).shape
      (2, 16, 4, 8)
      >>> padding = jax.numpy.arange(16) < jax.numpy.array([[16], [11]])  # (B, S)
      >>> out = attention.favor_attention(q, k, v, w.matrix(), mask=padding[:, None, None])
      >>> bool(jax.numpy.all(out == attention.favor_attention(q, k, v, w, mask=padding)))
      True

      The same attention with the sequence split along a mesh axis "seq" over the devices
      (T/D positions on each of D devices):

      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((jax.device_count(),), ("seq",))
      >>> split = P(None, "seq")
      >>> q, k, v = (jax.device_put(x, NamedSharding(mesh, split)) for x in (q, k, v))
      >>> def local(q, k, v):
      ...     return attention.favor_attention(q, k, v, w, causal=True, sequence_axis="seq")
      >>> jax.shard_map(local, mesh=mesh, in_specs=split, out_specs=split)(q, k, v).shape
      (2, 16, 4, 8)

      Or on global arrays, the split checked from their types:

      >>> from jax.sharding import AxisType
      >>> explicit = jax.make_mesh((jax.device_count(),), ("seq",), (AxisType.Explicit,))
      >>> with jax.set_mesh(explicit):
      ...     q, k, v = (jax.device_put(x, NamedSharding(explicit, split)) for x in (q, k, v))
      ...     out = attention.favor_attention(q, k, v, w, causal=True, sequence_axis="seq")
      >>> out.shape
      (2, 16, 4, 8)

    References:
      Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, arXiv:2009.14794
      (FAVOR+, Sec. 2-3 and App. B.1 prefix sums); Reid et al., "Simplex Random Features", ICML
      2023, arXiv:2301.13856, Sec. 5.4 (SimRF in Performers).
    """
    causal = check_causal(causal)
    query, key, value, unbatched = check_qkv(query, key, value, causal=causal)
    batch, key_length, num_heads, head_dim = key.shape
    sequence_axis = check_sequence_axis(sequence_axis)
    backend = resolve_implementation(implementation, jax.default_backend()).backend
    if backend is not None and sequence_axis is not None:
        raise ValueError(
            f"implementation={implementation!r} runs on one device: with sequence_axis use "
            f"implementation='xla'"
        )
    mask = mask[None] if unbatched and mask is not None else mask
    global_split = (
        not bound_by_shard_map(sequence_axis)
        if sequence_axis is not None
        else is_split(dict(query=query, key=key, value=value, mask=mask))
    )
    if global_split:  # global arrays split over Explicit mesh axes: a shard_map of local calls
        # A given mask checked and read as (B, S) (its split kept); None stays unsplit.
        mask = None if mask is None else check_mask(mask, batch, key_length)
        options: dict[str, object] = dict(
            causal=causal, chunk_size=chunk_size, stabilize=stabilize, eps=eps
        )
        # Sequence parallelism runs the XLA form on each device.
        options["implementation"] = "xla" if sequence_axis is not None else implementation
        out = _attend_split(
            query, key, value, mask, projection, feature_map, sequence_axis, options
        )
        return out[0] if unbatched else out
    check_split_along(sequence_axis, query=query, key=key, value=value, mask=mask)
    mask = check_mask(mask, batch, key_length)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    given_shape = query.shape[1:] if unbatched else query.shape
    projection, projection_axis = check_projection(
        projection, head_dim, num_heads, query_shape=given_shape
    )
    fmap, map_axis = resolve_feature_map(feature_map, num_heads)
    # OPRF/DERF without statistics: fitted to these inputs (_data_fitted).
    dtype = compute_dtype(query, key, value, projection)
    fmap, map_axis = fit_if_unfitted(
        fmap, map_axis, query, key, mask, causal=causal, dtype=dtype, sequence_axis=sequence_axis
    )
    stabilize = resolve_stabilize(stabilize, fmap)
    axes = (projection_axis, map_axis)
    inputs = jnp.result_type(query.dtype, key.dtype, value.dtype)
    widths = (query.shape[-1], value.shape[-1])
    if implementation == "auto" and sequence_axis is None and stabilize and dtype != jnp.float64:
        backend = _auto_backend(
            fmap, projection, causal=causal, dtype=inputs, widths=widths, axes=axes
        )
    elif backend is not None:
        if not stabilize:
            raise ValueError(
                f"implementation={implementation!r} always stabilises; with stabilize=False use "
                f"implementation='xla'"
            )
        if dtype == jnp.float64:  # the kernels accumulate in float32
            raise ValueError(
                f"implementation={implementation!r} computes in float32 (its kernels accumulate "
                f"in float32); float64 inputs or projection compute in float64 with "
                f"implementation='xla'"
            )
        check_fusable(fmap, projection, implementation, dtype=inputs, widths=widths, axes=axes)
    eps = default_eps(eps, dtype, signed=has_signed_features(fmap))
    if query.size == 0 or value.size == 0:
        # Empty B, T, N, S or H_v (the arguments checked): with no keys (S = 0) every row is 0.
        out_shape = (*query.shape[:3], value.shape[-1])
        out = jnp.zeros(out_shape, jnp.result_type(query.dtype, key.dtype, value.dtype))
        return out[0] if unbatched else out
    out = _favor_attention(
        query,
        key,
        value,
        mask,
        projection,
        fmap,
        axes=axes,
        stabilize=stabilize,
        causal=causal,
        chunk_size=chunk_size if causal else 0,  # unused: one compilation for all values
        eps=eps,
        sequence_axis=sequence_axis,
        backend=backend,
        kernel_settings=None if backend is None else _kernel_settings.IN_FORCE,
    )
    return out[0] if unbatched else out


def _auto_backend(fmap, projection, *, causal: bool, dtype, widths, axes) -> Backend | None:
    """The fused kernels' backend ``"auto"`` picks for this call, or ``None`` (the XLA form):
    the measured choice (``auto_choice``) where its kernels take the map and the heads' and
    values' ``widths`` (H, P). ``dtype``: the inputs' (``AUTO`` is keyed by the benchmark's
    input dtype; the compute dtype of bfloat16 inputs is float32)."""
    platform = jax.default_backend()
    capability = cuda_capability() if platform == "gpu" else None
    dtype_name = jnp.dtype(dtype).name
    choice = auto_choice(platform, causal=causal, dtype=dtype_name, capability=capability)
    if choice == "xla":
        return None
    if not fusable(fmap, projection, choice, dtype=dtype, widths=widths, axes=axes):
        return None
    return IMPLEMENTATION_TABLE[choice].backend


def _attend_split(
    query, key, value, mask, projection, feature_map, sequence_axis: str | None, options: dict
) -> jax.Array:
    """``favor_attention`` on global arrays split over the Explicit axis ``sequence_axis`` (or,
    with ``None``, over Explicit axes that split the batch or heads): one local call per device
    inside ``jax.shard_map`` (``_global_split``)."""
    fmap, _ = resolve_feature_map(feature_map, query.shape[-2])
    if is_unfitted(fmap) and not options["causal"]:  # fitted to the whole batch and sequence

        def fit(query, key, valid, pooled_axes):
            return fit_to_inputs(fmap, query, key, valid, causal=False, sequence_axis=pooled_axes)

        dtype = compute_dtype(query, key, value, projection)
        arrays = dict(query=query.astype(dtype), key=key.astype(dtype), mask=mask)
        feature_map = fit_split(fit, sequence_axis, arrays)
    named_map = isinstance(feature_map, str)
    shared = (projection,) if named_map else (projection, feature_map)

    def local(query, key, value, mask, shared):
        fmap = feature_map if named_map else shared[1]
        return favor_attention(
            query,
            key,
            value,
            shared[0],
            feature_map=fmap,
            mask=mask,
            sequence_axis=sequence_axis,
            **options,
        )

    arrays = dict(query=query, key=key, value=value, mask=mask)
    return attend_split(local, sequence_axis, arrays, shared)


@functools.partial(
    jax.jit,
    static_argnames=(
        "axes",
        "stabilize",
        "causal",
        "chunk_size",
        "eps",
        "sequence_axis",
        "backend",
        "kernel_settings",
    ),
)
def _favor_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    causal: bool,
    chunk_size: int,
    eps: float,
    sequence_axis: str | None,
    backend: Backend | None,
    kernel_settings: KernelSettings | None,
) -> jax.Array:
    # ``kernel_settings``: the fused kernels' settings in force, which they read when traced;
    # static, so that a call under other settings (``fused_kernel_settings``) compiles afresh.
    del kernel_settings
    out_dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
    dtype = compute_dtype(query, key, value, projection)
    # Low-precision inputs: the log-features, shifts and exponentials in float32 (a logit's
    # rounding is a multiplicative error e^{rounding}), the products' operands (factors in
    # [0, 1], values) in the inputs' dtype, accumulated in float32.
    matmul_dtype = out_dtype if jnp.finfo(out_dtype).bits < 32 else None
    query, key, value = (x.astype(dtype) for x in (query, key, value))
    if backend is not None:
        out = fused_attention(
            query,
            key,
            value,
            mask,
            projection,
            fmap,
            axes=axes,
            causal=causal,
            eps=eps,
            backend=backend,
            matmul_dtype=matmul_dtype or dtype,
        )
    elif causal:
        out = causal_attention(
            query,
            key,
            value,
            mask,
            projection,
            fmap,
            axes=axes,
            stabilize=stabilize,
            chunk_size=chunk_size,
            eps=eps,
            sequence_axis=sequence_axis,
            matmul_dtype=matmul_dtype,
        )
    else:
        out = bidirectional_attention(
            normalise(query),
            normalise(key),
            value,
            mask,
            projection,
            fmap,
            axes=axes,
            stabilize=stabilize,
            eps=eps,
            block=min(BIDIRECTIONAL_BLOCK, max(query.shape[1], key.shape[1])),
            sequence_axis=sequence_axis,
        )
    return out.astype(out_dtype)
