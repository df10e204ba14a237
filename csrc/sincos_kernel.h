// scale * [sin t, cos t] of the rows of a matrix, for one instruction set (see fwht_kernel.h for
// how a header is compiled once per instruction set; the same rules hold here: everything lives
// in the namespace RFJAX_ISA and calls no inline standard-library function, only the C library's
// sin/cos, which are compiled once).
//
// y[r, 0:m] = scale sin(t[r, :]), y[r, m:2m] = scale cos(t[r, :]) for each of `rows` rows of
// length m: the layout of random Fourier features. The algorithm is rfjax.ops.sin_cos's (whose
// Python module holds the constants and passes them in): t = r + k pi/2 with k the nearest
// integer to t 2/pi and r by a three-part Cody-Waite reduction (exact for |t| <= limit), sin r
// and cos r by minimax polynomials in z = r^2 evaluated by Horner's rule, then the quadrant
// (k - s) mod 4 picks +-sin r or +-cos r (s = 1 for sin t, 0 for cos t). Every operation is the
// Python one, in the same order, with no fused multiply-adds (the products and sums are
// separate, as XLA evaluates them), so the two agree to the last bit where both are exact.
//
// The loop over a row is written for the compiler's vectoriser (no branches: the nearest
// integer by adding and subtracting 1.5 2^p, the quadrant from the low bits of that sum, the
// choices as selects). Elements with |t| > limit, NaN or +-inf are computed by the C library's
// sin and cos in a second pass over the row (their first-pass values, from t = 0, are
// overwritten), which is exact for every finite t.

#ifndef RFJAX_ISA
#error "define RFJAX_ISA, the namespace of this instruction set (see setup.py)"
#endif

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rfjax {
namespace RFJAX_ISA {

// The constants of the reduction and polynomials (rfjax/ops/_cos.py): pi/2 = split[0] + split[1]
// + split[2]; sin r = r + r z (s_0 + z (s_1 + ...)), cos r = 1 - z/2 + z^2 (c_0 + z (c_1 + ...)).
template <class T>
struct SinCosConstants {
  const T* split;       // 3 values
  const T* sine;        // num_sine values
  const T* cosine;      // num_cosine values
  int num_sine;
  int num_cosine;
  T limit;              // |t| up to which the reduction is exact
};

template <class T>
struct Bits;
template <>
struct Bits<float> {
  using U = uint32_t;
  static constexpr float kRound = 12582912.0f;  // 1.5 2^23: x + it rounds x to an integer
};
template <>
struct Bits<double> {
  using U = uint64_t;
  static constexpr double kRound = 6755399441055744.0;  // 1.5 2^52
};

template <class T>
inline typename Bits<T>::U to_bits(T x) {
  typename Bits<T>::U bits;
  std::memcpy(&bits, &x, sizeof(T));
  return bits;
}

template <class T>
inline T from_bits(typename Bits<T>::U bits) {
  T x;
  std::memcpy(&x, &bits, sizeof(T));
  return x;
}

template <class T>
inline T sin_cos_abs(T x) {
  return x < T(0) ? -x : x;
}

// +-sin r or +-cos r for quadrant q = 0..3 (cos r, -sin r, -cos r, sin r), as bit operations:
// the odd quadrants take sin r, quadrants 1 and 2 flip the sign.
template <class T>
inline T quadrant_value(typename Bits<T>::U q, T cos_r, T sin_r) {
  using U = typename Bits<T>::U;
  const U odd = U(0) - (q & U(1));  // all ones in odd quadrants
  const U bits = (to_bits(sin_r) & odd) | (to_bits(cos_r) & ~odd);
  const U sign = ((q + U(1)) & U(2)) << (8 * sizeof(T) - 2);  // the sign bit in quadrants 1, 2
  return from_bits<T>(bits ^ sign);
}

// One row: y_sin[j] = scale sin t[j], y_cos[j] = scale cos t[j]. kS and kC are the numbers of
// polynomial coefficients (compile-time, so that the Horner loops unroll inside the vector loop).
// The first loop has no branches (selects are bit masks), so that it vectorises on every
// instruction set; the second recomputes the elements it could not.
template <class T, int kS, int kC>
void sin_cos_row(const T* __restrict t, T* __restrict y_sin, T* __restrict y_cos, size_t m,
                 const SinCosConstants<T>& k, T scale) {
  using U = typename Bits<T>::U;
  const T two_over_pi = static_cast<T>(2.0 / 3.14159265358979323846);
  const T round = Bits<T>::kRound;
  const T c1 = k.split[0], c2 = k.split[1], c3 = k.split[2];
  T s[kS], c[kC];
  for (int i = 0; i < kS; ++i) s[i] = k.sine[i];
  for (int i = 0; i < kC; ++i) c[i] = k.cosine[i];
  const T limit = k.limit;
  U outside_any = 0;
  for (size_t j = 0; j < m; ++j) {
    // t where |t| <= limit, else 0 (also for NaN, whose comparison is false): fixed below
    const U inside = U(0) - U(sin_cos_abs(t[j]) <= limit);
    outside_any |= ~inside;
    const T x = from_bits<T>(to_bits(t[j]) & inside);
    const T shifted = x * two_over_pi + round;  // two operations: no FMA contraction
    const T q = shifted - round;                // k, the nearest integer (ties to even)
    const U bits = to_bits(shifted);            // its low bits are k mod 2^p (two's complement)
    const T r = ((x - q * c1) - q * c2) - q * c3;
    const T z = r * r;
    T hs = s[kS - 1];
    for (int i = kS - 2; i >= 0; --i) hs = s[i] + z * hs;
    T hc = c[kC - 1];
    for (int i = kC - 2; i >= 0; --i) hc = c[i] + z * hc;
    const T sin_r = r + r * z * hs;
    const T cos_r = T(1) - T(0.5) * z + z * z * hc;
    y_cos[j] = scale * quadrant_value<T>(bits & U(3), cos_r, sin_r);           // cos(r + k pi/2)
    y_sin[j] = scale * quadrant_value<T>((bits + U(3)) & U(3), cos_r, sin_r);  // k - 1
  }
  if (outside_any == 0) return;
  for (size_t j = 0; j < m; ++j) {
    if (!(sin_cos_abs(t[j]) <= limit)) {  // beyond the exact reduction, NaN or +-inf
      y_sin[j] = scale * static_cast<T>(::sin(static_cast<double>(t[j])));
      y_cos[j] = scale * static_cast<T>(::cos(static_cast<double>(t[j])));
    }
  }
}

// Rows of t (rows x m) to rows of y (rows x 2m); false if the numbers of coefficients are not
// the compiled ones (3 and 3 for float32, 6 and 6 for float64).
template <class T>
bool sin_cos_rows(const T* t, T* y, size_t m, size_t rows, const SinCosConstants<T>& k,
                  T scale) {
  constexpr int kN = sizeof(T) == 4 ? 3 : 6;
  if (k.num_sine != kN || k.num_cosine != kN) return false;
  for (size_t r = 0; r < rows; ++r) {
    sin_cos_row<T, kN, kN>(t + r * m, y + r * 2 * m, y + r * 2 * m + m, m, k, scale);
  }
  return true;
}

// The entry points of one instruction set (declared in fwht_kernel_api.h).
bool sin_cos_rows_f32(const float* t, float* y, size_t m, size_t rows, const float* split,
                      const float* sine, int num_sine, const float* cosine, int num_cosine,
                      float limit, float scale) {
  return sin_cos_rows<float>(t, y, m, rows, {split, sine, cosine, num_sine, num_cosine, limit},
                             scale);
}
bool sin_cos_rows_f64(const double* t, double* y, size_t m, size_t rows, const double* split,
                      const double* sine, int num_sine, const double* cosine, int num_cosine,
                      double limit, double scale) {
  return sin_cos_rows<double>(t, y, m, rows, {split, sine, cosine, num_sine, num_cosine, limit},
                              scale);
}

}  // namespace RFJAX_ISA
}  // namespace rfjax
