// Declarations of the per-instruction-set kernels compiled from fwht_isa.cc (see fwht_kernel.h).
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
