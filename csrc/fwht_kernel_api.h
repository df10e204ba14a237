// Declarations of the per-instruction-set kernels compiled from fwht_isa.cc (see fwht_kernel.h
// and sincos_kernel.h).
#ifndef RFJAX_FWHT_KERNEL_API_H_
#define RFJAX_FWHT_KERNEL_API_H_

#include <cstddef>

#define RFJAX_DECLARE_ISA(isa)                                                             \
  namespace rfjax {                                                                        \
  namespace isa {                                                                          \
  void transform_rows_f32(const float* in, float* out, size_t n, size_t rows, bool scaled, \
                          float scale);                                                    \
  void transform_rows_f64(const double* in, double* out, size_t n, size_t rows,           \
                          bool scaled, double scale);                                      \
  void hd_chain_rows_f32(const float* x, const float* signs, const float* norms, float* y, \
                         size_t p, size_t rows, size_t blocks, size_t rotations,           \
                         float scale, bool simplex, const float* simplex_terms);           \
  void hd_chain_rows_f64(const double* x, const double* signs, const double* norms,       \
                         double* y, size_t p, size_t rows, size_t blocks, size_t rotations, \
                         double scale, bool simplex, const double* simplex_terms);         \
  bool sin_cos_rows_f32(const float* t, float* y, size_t m, size_t rows,                  \
                        const float* split, const float* sine, int num_sine,               \
                        const float* cosine, int num_cosine, float limit, float scale);    \
  bool sin_cos_rows_f64(const double* t, double* y, size_t m, size_t rows,                \
                        const double* split, const double* sine, int num_sine,             \
                        const double* cosine, int num_cosine, double limit,                \
                        double scale);                                                     \
  }                                                                                        \
  }

#if defined(RFJAX_HAVE_AVX512)
RFJAX_DECLARE_ISA(avx512)
#endif
#if defined(RFJAX_HAVE_AVX2)
RFJAX_DECLARE_ISA(avx2)
#endif
#if defined(RFJAX_HAVE_SSE2)
RFJAX_DECLARE_ISA(sse2)
#endif
RFJAX_DECLARE_ISA(scalar)

#undef RFJAX_DECLARE_ISA

#endif  // RFJAX_FWHT_KERNEL_API_H_
