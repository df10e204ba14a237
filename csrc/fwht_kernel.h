// The fast Walsh-Hadamard transform of rows of a matrix, for one instruction set.
//
// This header is compiled once per instruction set by fwht_isa.cc (see setup.py): with
// RFJAX_ISA the name of the namespace to define, and the compiler flags of that instruction set
// (-mavx512f, -mavx2 -mfma, the x86-64 baseline SSE2, or RFJAX_SCALAR for the portable scalar
// path). fwht_cpu.cc picks one of the compiled namespaces at load time from the CPU's features.
// Everything here lives in that namespace and uses no out-of-line standard-library functions,
// so that no code compiled for one instruction set can be shared with (and run by) another.
//
// y[r, :] = H_n x[r, :] (optionally times `scale`) for each of `rows` rows of length n, n a
// power of two, H_n the Sylvester-Hadamard matrix in natural order.
//
// Algorithm (radix-2^R decimation over the bits of the index, low bits first):
//  * SIMD vectors of W lanes; the log2(W) stages with stride < W run inside one register
//    (lane permutes), the others combine whole vectors with radix-2^R butterflies (R stages on
//    2^R vectors held in registers, so one memory pass performs R stages).
//  * Phase 1 (cache blocking): the stages with stride < kChunk run on L1-sized chunks of
//    kChunk contiguous elements (or groups of whole rows when n < kChunk). The first pass over a
//    chunk reads the input and writes the output (out of place: in-register stages plus up to
//    R vector stages); the remaining small-stride passes run in place on the output while the
//    chunk is in L1.
//  * Phase 2: for n > kChunk, the stages with stride >= kChunk run in place on the output row
//    (in L2 for rows up to ~1 MiB), again with radix-2^R passes.
//  * The scale is folded into the last pass. No temporaries beyond the output.
//
// Vector back ends: AVX-512F, AVX2 (+FMA when available), SSE2, and the portable scalar one.

#ifndef RFJAX_ISA
#error "define RFJAX_ISA, the namespace of this instruction set (see setup.py)"
#endif

#include <cstddef>
#include <cstdint>
#include <utility>

#if !defined(RFJAX_SCALAR) && (defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__))
#include <immintrin.h>
#endif

namespace rfjax {
namespace RFJAX_ISA {

template <class T>
inline T min_of(T a, T b) {
  return a < b ? a : b;
}
template <class T>
inline T max_of(T a, T b) {
  return a < b ? b : a;
}

#if defined(__GNUC__)
#define RFJAX_INLINE inline __attribute__((always_inline))
#else
#define RFJAX_INLINE inline
#endif

// ---------------------------------------------------------------------------------------------
// Vector back ends. Each provides: V, W (lanes), kLogW, kMaxR (largest radix exponent of the
// register butterflies), load/store (unaligned), add, sub, mul, set1, and inreg(v): the kLogW
// stages with stride < W on the lanes of one vector.
// ---------------------------------------------------------------------------------------------

template <class Scalar>
struct ScalarOps {
  using T = Scalar;
  using V = Scalar;
  static constexpr int W = 1;
  static constexpr int kLogW = 0;
  static constexpr int kMaxR = 3;
  static RFJAX_INLINE V load(const T* p) { return *p; }
  static RFJAX_INLINE void store(T* p, V v) { *p = v; }
  static RFJAX_INLINE V add(V a, V b) { return a + b; }
  static RFJAX_INLINE V sub(V a, V b) { return a - b; }
  static RFJAX_INLINE V mul(V a, V b) { return a * b; }
  static RFJAX_INLINE V set1(T a) { return a; }
  static RFJAX_INLINE V inreg(V v) { return v; }
};

#if defined(RFJAX_SCALAR)
using OpsF32 = ScalarOps<float>;
using OpsF64 = ScalarOps<double>;
#elif defined(__AVX512F__)
struct OpsF32 {
  using T = float;
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int kLogW = 4;
  static constexpr int kMaxR = 4;  // 16 vectors in flight out of 32 registers
  static RFJAX_INLINE V load(const T* p) { return _mm512_loadu_ps(p); }
  static RFJAX_INLINE void store(T* p, V v) { _mm512_storeu_ps(p, v); }
  static RFJAX_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  static RFJAX_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static RFJAX_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static RFJAX_INLINE V set1(T a) { return _mm512_set1_ps(a); }
  // One in-register stage: lane i gets partner + (i has the stage's bit ? -x : x), computed as
  // fma(x, sign, partner), exact since sign = +-1.
  static RFJAX_INLINE V inreg(V x) {
    const V s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const V s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
    const V s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
    const V s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
    x = _mm512_fmadd_ps(x, s1, _mm512_permute_ps(x, 0xB1));
    x = _mm512_fmadd_ps(x, s2, _mm512_permute_ps(x, 0x4E));
    x = _mm512_fmadd_ps(x, s4, _mm512_shuffle_f32x4(x, x, 0xB1));
    x = _mm512_fmadd_ps(x, s8, _mm512_shuffle_f32x4(x, x, 0x4E));
    return x;
  }
};
struct OpsF64 {
  using T = double;
  using V = __m512d;
  static constexpr int W = 8;
  static constexpr int kLogW = 3;
  static constexpr int kMaxR = 4;
  static RFJAX_INLINE V load(const T* p) { return _mm512_loadu_pd(p); }
  static RFJAX_INLINE void store(T* p, V v) { _mm512_storeu_pd(p, v); }
  static RFJAX_INLINE V add(V a, V b) { return _mm512_add_pd(a, b); }
  static RFJAX_INLINE V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  static RFJAX_INLINE V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static RFJAX_INLINE V set1(T a) { return _mm512_set1_pd(a); }
  static RFJAX_INLINE V inreg(V x) {
    const V s1 = _mm512_setr_pd(1, -1, 1, -1, 1, -1, 1, -1);
    const V s2 = _mm512_setr_pd(1, 1, -1, -1, 1, 1, -1, -1);
    const V s4 = _mm512_setr_pd(1, 1, 1, 1, -1, -1, -1, -1);
    x = _mm512_fmadd_pd(x, s1, _mm512_permute_pd(x, 0x55));
    x = _mm512_fmadd_pd(x, s2, _mm512_shuffle_f64x2(x, x, 0xB1));
    x = _mm512_fmadd_pd(x, s4, _mm512_shuffle_f64x2(x, x, 0x4E));
    return x;
  }
};
#elif defined(__AVX__)
struct OpsF32 {
  using T = float;
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int kLogW = 3;
  static constexpr int kMaxR = 3;  // 8 vectors in flight out of 16 registers
  static RFJAX_INLINE V load(const T* p) { return _mm256_loadu_ps(p); }
  static RFJAX_INLINE void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  static RFJAX_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  static RFJAX_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static RFJAX_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static RFJAX_INLINE V set1(T a) { return _mm256_set1_ps(a); }
  static RFJAX_INLINE V step(V x, V partner, V sign) {
#if defined(__FMA__)
    return _mm256_fmadd_ps(x, sign, partner);
#else
    return _mm256_add_ps(partner, _mm256_mul_ps(x, sign));
#endif
  }
  static RFJAX_INLINE V inreg(V x) {
    const V s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const V s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const V s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    x = step(x, _mm256_permute_ps(x, 0xB1), s1);
    x = step(x, _mm256_permute_ps(x, 0x4E), s2);
    x = step(x, _mm256_permute2f128_ps(x, x, 1), s4);
    return x;
  }
};
struct OpsF64 {
  using T = double;
  using V = __m256d;
  static constexpr int W = 4;
  static constexpr int kLogW = 2;
  static constexpr int kMaxR = 3;
  static RFJAX_INLINE V load(const T* p) { return _mm256_loadu_pd(p); }
  static RFJAX_INLINE void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static RFJAX_INLINE V add(V a, V b) { return _mm256_add_pd(a, b); }
  static RFJAX_INLINE V sub(V a, V b) { return _mm256_sub_pd(a, b); }
  static RFJAX_INLINE V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static RFJAX_INLINE V set1(T a) { return _mm256_set1_pd(a); }
  static RFJAX_INLINE V step(V x, V partner, V sign) {
#if defined(__FMA__)
    return _mm256_fmadd_pd(x, sign, partner);
#else
    return _mm256_add_pd(partner, _mm256_mul_pd(x, sign));
#endif
  }
  static RFJAX_INLINE V inreg(V x) {
    const V s1 = _mm256_setr_pd(1, -1, 1, -1);
    const V s2 = _mm256_setr_pd(1, 1, -1, -1);
    x = step(x, _mm256_permute_pd(x, 0x5), s1);
    x = step(x, _mm256_permute2f128_pd(x, x, 1), s2);
    return x;
  }
};
#elif defined(__SSE2__)
struct OpsF32 {
  using T = float;
  using V = __m128;
  static constexpr int W = 4;
  static constexpr int kLogW = 2;
  static constexpr int kMaxR = 3;
  static RFJAX_INLINE V load(const T* p) { return _mm_loadu_ps(p); }
  static RFJAX_INLINE void store(T* p, V v) { _mm_storeu_ps(p, v); }
  static RFJAX_INLINE V add(V a, V b) { return _mm_add_ps(a, b); }
  static RFJAX_INLINE V sub(V a, V b) { return _mm_sub_ps(a, b); }
  static RFJAX_INLINE V mul(V a, V b) { return _mm_mul_ps(a, b); }
  static RFJAX_INLINE V set1(T a) { return _mm_set1_ps(a); }
  static RFJAX_INLINE V inreg(V x) {
    const V m1 = _mm_castsi128_ps(_mm_setr_epi32(0, INT32_MIN, 0, INT32_MIN));
    const V m2 = _mm_castsi128_ps(_mm_setr_epi32(0, 0, INT32_MIN, INT32_MIN));
    x = _mm_add_ps(_mm_shuffle_ps(x, x, 0xB1), _mm_xor_ps(x, m1));
    x = _mm_add_ps(_mm_shuffle_ps(x, x, 0x4E), _mm_xor_ps(x, m2));
    return x;
  }
};
struct OpsF64 {
  using T = double;
  using V = __m128d;
  static constexpr int W = 2;
  static constexpr int kLogW = 1;
  static constexpr int kMaxR = 3;
  static RFJAX_INLINE V load(const T* p) { return _mm_loadu_pd(p); }
  static RFJAX_INLINE void store(T* p, V v) { _mm_storeu_pd(p, v); }
  static RFJAX_INLINE V add(V a, V b) { return _mm_add_pd(a, b); }
  static RFJAX_INLINE V sub(V a, V b) { return _mm_sub_pd(a, b); }
  static RFJAX_INLINE V mul(V a, V b) { return _mm_mul_pd(a, b); }
  static RFJAX_INLINE V set1(T a) { return _mm_set1_pd(a); }
  static RFJAX_INLINE V inreg(V x) {
    const V m1 = _mm_castsi128_pd(_mm_setr_epi32(0, 0, 0, INT32_MIN));
    return _mm_add_pd(_mm_shuffle_pd(x, x, 1), _mm_xor_pd(x, m1));
  }
};
#else
using OpsF32 = ScalarOps<float>;
using OpsF64 = ScalarOps<double>;
#endif

template <class T>
struct OpsFor;
template <>
struct OpsFor<float> {
  using type = OpsF32;
};
template <>
struct OpsFor<double> {
  using type = OpsF64;
};

// ---------------------------------------------------------------------------------------------
// One pass: R butterfly stages at strides s, 2s, ..., 2^(R-1) s (s a multiple of W) over a
// block of L elements (L a multiple of s * 2^R), optionally preceded by the in-register stages
// (kInreg, then s must equal W) and followed by the scale. in == out is allowed (in place).
// ---------------------------------------------------------------------------------------------

// Compile-time loop: f(std::integral_constant<int, 0>{}), ..., f(...<N - 1>{}), fully unrolled so
// that the 2^R vectors of a butterfly stay in registers.
template <class F, int... I>
RFJAX_INLINE void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
RFJAX_INLINE void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

// R radix-2 stages on a[0 .. 2^R): stage h pairs (i, i + 2^h) for i with bit h clear.
template <class Ops, int R>
RFJAX_INLINE void butterflies(typename Ops::V* a) {
  static_for<R>([&](auto h) {
    constexpr int kH = 1 << decltype(h)::value;
    static_for<(1 << R) / 2>([&](auto p) {
      constexpr int kP = decltype(p)::value;
      constexpr int kI = (kP / kH) * 2 * kH + kP % kH;  // p-th index with bit h clear
      const typename Ops::V u = a[kI];
      const typename Ops::V v = a[kI + kH];
      a[kI] = Ops::add(u, v);
      a[kI + kH] = Ops::sub(u, v);
    });
  });
}

template <class Ops, int R, bool kInreg, bool kScale>
void pass(const typename Ops::T* in, typename Ops::T* out, size_t L, size_t s,
          typename Ops::T scale) {
  using V = typename Ops::V;
  constexpr int kW = Ops::W;
  constexpr int kM = 1 << R;
  const V vscale = Ops::set1(scale);
  const size_t span = s * kM;
  for (size_t base = 0; base < L; base += span) {
    for (size_t j = 0; j < s; j += kW) {
      const size_t o = base + j;
      V a[kM];
      static_for<kM>([&](auto t) {
        a[t] = Ops::load(in + o + t * s);
        if constexpr (kInreg) a[t] = Ops::inreg(a[t]);
      });
      butterflies<Ops, R>(a);
      static_for<kM>([&](auto t) {
        if constexpr (kScale) a[t] = Ops::mul(a[t], vscale);
        Ops::store(out + o + t * s, a[t]);
      });
    }
  }
}

template <class Ops, bool kInreg, bool kScale>
void pass_r(int r, const typename Ops::T* in, typename Ops::T* out, size_t L, size_t s,
            typename Ops::T scale) {
  switch (r) {
    case 0:
      return pass<Ops, 0, kInreg, kScale>(in, out, L, s, scale);
    case 1:
      return pass<Ops, 1, kInreg, kScale>(in, out, L, s, scale);
    case 2:
      return pass<Ops, 2, kInreg, kScale>(in, out, L, s, scale);
    case 3:
      return pass<Ops, 3, kInreg, kScale>(in, out, L, s, scale);
    default:
      if constexpr (Ops::kMaxR >= 4) return pass<Ops, 4, kInreg, kScale>(in, out, L, s, scale);
  }
}

template <class Ops, bool kInreg>
void run_pass(int r, const typename Ops::T* in, typename Ops::T* out, size_t L, size_t s,
              bool last, bool scaled, typename Ops::T scale) {
  if (last && scaled) {
    pass_r<Ops, kInreg, true>(r, in, out, L, s, scale);
  } else {
    pass_r<Ops, kInreg, false>(r, in, out, L, s, scale);
  }
}

// Splits q stages into passes of at most max_r stages, as equal as possible.
inline int num_passes(int q, int max_r) { return q <= 0 ? 0 : (q + max_r - 1) / max_r; }
inline int pass_size(int q, int passes, int i) { return q / passes + (i < q % passes ? 1 : 0); }

// Bytes of one L1 chunk (phase 1 block): 32 KiB fits the L1d of current x86 and ARM cores.
constexpr size_t kChunkBytes = 32 * 1024;

inline int log2_exact(size_t n) {
  int k = 0;
  while ((size_t{1} << k) < n) ++k;
  return k;
}

// Scalar reference path: rows with n < W (or any n with the scalar back end).
template <class T>
void rows_scalar(const T* in, T* out, size_t n, size_t rows, bool scaled, T scale) {
  for (size_t r = 0; r < rows; ++r) {
    const T* x = in + r * n;
    T* y = out + r * n;
    if (n == 1) {
      y[0] = scaled ? x[0] * scale : x[0];
      continue;
    }
    for (size_t i = 0; i < n; i += 2) {  // read both before writing: in == out is allowed
      const T u = x[i];
      const T v = x[i + 1];
      y[i] = u + v;
      y[i + 1] = u - v;
    }
    for (size_t h = 2; h < n; h <<= 1) {
      for (size_t i = 0; i < n; i += 2 * h) {
        for (size_t j = i; j < i + h; ++j) {
          const T u = y[j];
          const T v = y[j + h];
          y[j] = u + v;
          y[j + h] = u - v;
        }
      }
    }
    if (scaled) {
      for (size_t i = 0; i < n; ++i) y[i] *= scale;
    }
  }
}

// Transforms `rows` consecutive rows of length n (n a power of two >= W) from in to out.
template <class Ops>
void rows_vector(const typename Ops::T* in, typename Ops::T* out, size_t n, size_t rows,
                 bool scaled, typename Ops::T scale) {
  using T = typename Ops::T;
  constexpr int kW = Ops::W;
  constexpr int kMaxR = Ops::kMaxR;
  const int k = log2_exact(n);
  const int log_chunk = log2_exact(kChunkBytes / sizeof(T));
  const int c = min_of(k, log_chunk);  // stages done in phase 1
  const int q1 = c - Ops::kLogW;                  // vector stages in phase 1
  const int r0 = min_of(q1, kMaxR);             // vector stages fused in the first pass
  const int p1 = num_passes(q1 - r0, kMaxR);      // further in-place phase-1 passes
  const int q2 = k - c;                           // phase-2 stages
  // Phase-2 passes touch 2^R lines a large power of two apart, which share one L1 set: at most
  // 8 of them (radix 8) so that they fit the set's ways.
  const int max_r2 = min_of(kMaxR, 3);
  const int p2 = num_passes(q2, max_r2);
  const size_t chunk = size_t{1} << c;

  auto phase1 = [&](const T* src, T* dst, size_t len, bool last_phase) {
    // First pass: in-register stages and r0 vector stages, out of place.
    run_pass<Ops, true>(r0, src, dst, len, kW, last_phase && p1 == 0, scaled, scale);
    size_t s = size_t{kW} << r0;
    for (int i = 0; i < p1; ++i) {
      const int r = pass_size(q1 - r0, p1, i);
      run_pass<Ops, false>(r, dst, dst, len, s, last_phase && i == p1 - 1, scaled, scale);
      s <<= r;
    }
  };

  if (n <= chunk) {
    // Several whole rows per L1-sized block.
    const size_t rows_per_block = max_of<size_t>(1, chunk / n);
    for (size_t r = 0; r < rows; r += rows_per_block) {
      const size_t nr = min_of(rows_per_block, rows - r);
      phase1(in + r * n, out + r * n, nr * n, true);
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    const T* x = in + r * n;
    T* y = out + r * n;
    for (size_t b = 0; b < n; b += chunk) phase1(x + b, y + b, chunk, false);
    size_t s = chunk;
    for (int i = 0; i < p2; ++i) {
      const int rr = pass_size(q2, p2, i);  // <= max_r2
      run_pass<Ops, false>(rr, y, y, n, s, i == p2 - 1, scaled, scale);
      s <<= rr;
    }
  }
}

template <class T>
void transform_rows(const T* in, T* out, size_t n, size_t rows, bool scaled, T scale) {
  using Ops = typename OpsFor<T>::type;
  if (n < static_cast<size_t>(Ops::W) || Ops::W == 1) {
    rows_scalar<T>(in, out, n, rows, scaled, scale);
  } else {
    rows_vector<Ops>(in, out, n, rows, scaled, scale);
  }
}

// sum_{j < n} z_j by pairwise summation (halves summed recursively, 8 terms in order at the
// leaves): rounding error O(log n) units, like XLA's tree reductions, not O(n).
template <class T>
T pairwise_sum(const T* z, size_t n) {
  if (n <= 8) {
    T total = 0;
    for (size_t j = 0; j < n; ++j) total += z[j];
    return total;
  }
  const size_t half = n / 2;
  return pairwise_sum(z, half) + pairwise_sum(z + half, n - half);
}

// The structured-coupling chain (rfjax.ops.hd_chain) on rows of x (rows x p), fused: for each
// row and block b, y = N_b [S] (H D_{b,k}) ... (H D_{b,1}) x with H the normalised transform, all
// stages on the p outputs of that block while they are in L1 (one read of x, one write of y,
// against 2k passes of separate transforms and products). The same operations in the same order
// as the composition (a product by the diagonal, the transform, scaled in its last pass), so the
// rotations agree with it to the last bit; S (simplex) sums the first p - 1 entries pairwise,
// which rounds differently from XLA's sum (to a few units in the last place). y is (rows, blocks, p); signs (blocks, k, p);
// norms (blocks, p). `scale` is 1/sqrt(p); S's coefficients are simplex[0] (on z_i),
// simplex[1] (on the sum), simplex[2] (the last entry's factor).
template <class T>
void hd_chain_rows(const T* x, const T* signs, const T* norms, T* y, size_t p, size_t rows,
                   size_t blocks, size_t rotations, T scale, bool simplex, const T* simplex_terms) {
  for (size_t r = 0; r < rows; ++r) {
    const T* in = x + r * p;
    for (size_t b = 0; b < blocks; ++b) {
      T* out = y + (r * blocks + b) * p;
      for (size_t i = 0; i < rotations; ++i) {
        const T* d = signs + (b * rotations + i) * p;
        const T* src = i == 0 ? in : out;
        for (size_t j = 0; j < p; ++j) out[j] = src[j] * d[j];
        transform_rows<T>(out, out, p, 1, p > 1, scale);
      }
      if (simplex) {
        const T sigma = pairwise_sum(out, p - 1);
        const T shift = simplex_terms[1] * sigma;
        for (size_t j = 0; j + 1 < p; ++j) out[j] = simplex_terms[0] * out[j] - shift;
        out[p - 1] = sigma / simplex_terms[2];
      }
      const T* n = norms + b * p;
      for (size_t j = 0; j < p; ++j) out[j] *= n[j];
    }
  }
}

// The entry points of one instruction set (declared in fwht_kernel_api.h).
void hd_chain_rows_f32(const float* x, const float* signs, const float* norms, float* y, size_t p,
                       size_t rows, size_t blocks, size_t rotations, float scale, bool simplex,
                       const float* simplex_terms) {
  hd_chain_rows<float>(x, signs, norms, y, p, rows, blocks, rotations, scale, simplex,
                       simplex_terms);
}
void hd_chain_rows_f64(const double* x, const double* signs, const double* norms, double* y,
                       size_t p, size_t rows, size_t blocks, size_t rotations, double scale,
                       bool simplex, const double* simplex_terms) {
  hd_chain_rows<double>(x, signs, norms, y, p, rows, blocks, rotations, scale, simplex,
                        simplex_terms);
}
void transform_rows_f32(const float* in, float* out, size_t n, size_t rows, bool scaled,
                        float scale) {
  transform_rows<float>(in, out, n, rows, scaled, scale);
}
void transform_rows_f64(const double* in, double* out, size_t n, size_t rows, bool scaled,
                        double scale) {
  transform_rows<double>(in, out, n, rows, scaled, scale);
}

}  // namespace RFJAX_ISA
}  // namespace rfjax
