// Fast Walsh-Hadamard transform of the last axis, registered with XLA through the XLA FFI.
//
// y[r, :] = H_n x[r, :] (optionally times 1/sqrt(n)) for every row r of an input viewed as
// rows x n, n a power of two, H_n the Sylvester-Hadamard matrix in natural order.
//
// The transform itself (fwht_kernel.h) is compiled once per instruction set (fwht_isa.cc, with
// the flags setup.py gives each: AVX-512F, AVX2+FMA, SSE2 and portable scalar on x86-64; scalar
// elsewhere); nothing is compiled with -march=native. At load time this file picks the best one
// the CPU supports (__builtin_cpu_supports), so one binary runs on any x86-64. The environment
// variable RFJAX_FWHT_CPU_ISA (avx512, avx2, sse2, scalar) asks for a lower one, and
// rfjax_fwht_select_isa switches at run time (for tests).
//
// Large batches are split over the XLA intra-op thread pool (the FFI ThreadPool) with work
// stealing: the calling thread takes tasks too and only waits for tasks already taken, so it
// never deadlocks when the pool is busy. Small work runs inline. Out of place (the output is not the operand's buffer), a large output is
// first advised to use transparent huge pages (see advise_huge_pages).

#include <algorithm>
#include <climits>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "fwht_kernel_api.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ---------------------------------------------------------------------------------------------
// Instruction-set dispatch.
// ---------------------------------------------------------------------------------------------

struct Kernel {
  const char* name;
  void (*f32)(const float*, float*, size_t, size_t, bool, float);
  void (*f64)(const double*, double*, size_t, size_t, bool, double);
  void (*chain_f32)(const float*, const float*, const float*, float*, size_t, size_t, size_t,
                    size_t, float, bool, const float*);
  void (*chain_f64)(const double*, const double*, const double*, double*, size_t, size_t, size_t,
                    size_t, double, bool, const double*);
  bool (*sin_cos_f32)(const float*, float*, size_t, size_t, const float*, const float*, int,
                      const float*, int, float, float);
  bool (*sin_cos_f64)(const double*, double*, size_t, size_t, const double*, const double*, int,
                      const double*, int, double, double);
};

#define RFJAX_KERNEL(isa)                                                                  \
  Kernel {                                                                                 \
    #isa, rfjax::isa::transform_rows_f32, rfjax::isa::transform_rows_f64,                  \
        rfjax::isa::hd_chain_rows_f32, rfjax::isa::hd_chain_rows_f64,                      \
        rfjax::isa::sin_cos_rows_f32, rfjax::isa::sin_cos_rows_f64                         \
  }

// Best first.
const Kernel kKernels[] = {
#if defined(RFJAX_HAVE_AVX512)
    RFJAX_KERNEL(avx512),
#endif
#if defined(RFJAX_HAVE_AVX2)
    RFJAX_KERNEL(avx2),
#endif
#if defined(RFJAX_HAVE_SSE2)
    RFJAX_KERNEL(sse2),
#endif
    RFJAX_KERNEL(scalar),
};
constexpr size_t kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

bool cpu_supports(const Kernel& kernel) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (std::strcmp(kernel.name, "avx512") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(kernel.name, "avx2") == 0) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  if (std::strcmp(kernel.name, "sse2") == 0) return __builtin_cpu_supports("sse2");
#endif
  return std::strcmp(kernel.name, "scalar") == 0;
}

const Kernel* find_kernel(const char* name) {
  for (const Kernel& kernel : kKernels) {
    if (std::strcmp(kernel.name, name) == 0) return &kernel;
  }
  return nullptr;
}

// The best supported kernel, or the one RFJAX_FWHT_CPU_ISA names when it is compiled and
// supported.
const Kernel* default_kernel() {
  const char* wanted = std::getenv("RFJAX_FWHT_CPU_ISA");
  if (wanted != nullptr && *wanted != '\0') {
    const Kernel* kernel = find_kernel(wanted);
    if (kernel != nullptr && cpu_supports(*kernel)) return kernel;
  }
  for (const Kernel& kernel : kKernels) {
    if (cpu_supports(kernel)) return &kernel;
  }
  return &kKernels[kNumKernels - 1];
}

std::atomic<const Kernel*>& active_kernel() {
  static std::atomic<const Kernel*> kernel{default_kernel()};
  return kernel;
}

template <class T>
void transform_rows(const T* in, T* out, size_t n, size_t rows, bool scaled, T scale) {
  const Kernel* kernel = active_kernel().load(std::memory_order_relaxed);
  if constexpr (std::is_same_v<T, float>) {
    kernel->f32(in, out, n, rows, scaled, scale);
  } else {
    kernel->f64(in, out, n, rows, scaled, scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Parallel driver: rows are cut into tasks; the FFI thread pool and the caller take tasks from
// a shared counter. The caller waits only until every task is done; tasks that start after all
// work is taken return without touching the buffers.
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Fresh outputs: an out-of-place call writes a buffer that XLA may have just mapped from the
// operating system, whose 4 KiB pages then fault one by one on first write (several
// microseconds each on a virtual machine: more than the transform of a large batch). For
// outputs of at least kHugePageMinBytes the kernel first asks Linux for transparent huge pages
// on the 2 MiB-aligned interior of the buffer (madvise MADV_HUGEPAGE, what NumPy does for its
// own large arrays), so such a buffer faults once per 2 MiB. Advice only: pages already mapped
// stay as they are, and a failure changes nothing.
// ---------------------------------------------------------------------------------------------

constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kHugePageMinBytes = size_t{4} << 20;

void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHugePageMinBytes) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t end = (start + bytes) & ~(uintptr_t{kHugePageBytes} - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// Below this many elements per call, no threads (the scheduling costs more than it saves).
constexpr size_t kParallelMinElements = size_t{1} << 16;
// Target elements per task (about 1 MiB of float32).
constexpr size_t kTaskElements = size_t{1} << 18;

struct TaskState {
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  size_t num_tasks = 0;
  std::mutex mu;
  std::condition_variable cv;
};

// The pool threads a call may use besides the calling thread: all of XLA's intra-op pool,
// capped by RFJAX_FWHT_CPU_THREADS and by max_threads (-1: no cap; 0: none). (Capping them at one
// per other core made the float32 transform of 2^22 elements 4-25% slower in place on 2 shared
// cores, benchmarks/fwht.py against the previous build.)
int64_t helper_threads(ffi::ThreadPool* pool, int64_t max_threads) {
  int64_t threads = pool != nullptr ? pool->num_threads() : 0;
  static const int64_t cap = [] {
    const char* env = std::getenv("RFJAX_FWHT_CPU_THREADS");
    return env != nullptr ? std::strtoll(env, nullptr, 10) : int64_t{-1};
  }();
  if (cap >= 0) threads = std::min(threads, cap);
  if (max_threads >= 0) threads = std::min(threads, max_threads);
  return threads;
}

// Calls work(first_row, num_rows) over `rows` rows of `row_elements` elements each, on the
// calling thread alone for small work, else in tasks shared with the pool's threads.
template <class Work>
void parallel_rows(ffi::ThreadPool* pool, size_t rows, size_t row_elements, int64_t max_threads,
                   Work work) {
  const int64_t threads = helper_threads(pool, max_threads);
  if (rows < 2 || rows * row_elements < kParallelMinElements || threads < 1) {
    work(size_t{0}, rows);
    return;
  }
  const size_t workers = static_cast<size_t>(threads) + 1;  // the pool and the caller
  size_t rows_per_task = std::max<size_t>(1, kTaskElements / std::max<size_t>(1, row_elements));
  // At least a few tasks per worker for balance, but not smaller than one row.
  rows_per_task = std::min(rows_per_task, std::max<size_t>(1, rows / (4 * workers)));
  auto state = std::make_shared<TaskState>();
  state->num_tasks = (rows + rows_per_task - 1) / rows_per_task;

  auto take_tasks = [state, rows, rows_per_task, work]() {
    size_t t;
    while ((t = state->next.fetch_add(1, std::memory_order_relaxed)) < state->num_tasks) {
      const size_t first = t * rows_per_task;
      work(first, std::min(rows_per_task, rows - first));
      if (state->done.fetch_add(1, std::memory_order_acq_rel) + 1 == state->num_tasks) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cv.notify_all();
      }
    }
  };
  const size_t helpers = std::min<size_t>(static_cast<size_t>(threads), state->num_tasks - 1);
  for (size_t i = 0; i < helpers; ++i) {
    auto task = take_tasks;
    pool->Schedule(std::move(task));
  }
  take_tasks();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] {
    return state->done.load(std::memory_order_acquire) == state->num_tasks;
  });
}

template <class T>
void run(ffi::ThreadPool* pool, const T* in, T* out, size_t n, size_t rows, bool normalize,
         int64_t max_threads) {
  const bool scaled = normalize && n > 1;
  const T scale = scaled ? static_cast<T>(1.0 / std::sqrt(static_cast<double>(n))) : T(1);
  if (in != out) advise_huge_pages(out, n * rows * sizeof(T));
  parallel_rows(pool, rows, n, max_threads, [=](size_t first, size_t count) {
    transform_rows<T>(in + first * n, out + first * n, n, count, scaled, scale);
  });
}

template <ffi::DataType DT>
ffi::Error fwht_impl(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::ResultBuffer<DT> y,
                     bool normalize, int64_t max_threads) {
  using T = ffi::NativeType<DT>;
  const auto dims = x.dimensions();
  const size_t count = x.element_count();
  if (count == 0) return ffi::Error::Success();
  const size_t n = dims.size() == 0 ? 1 : static_cast<size_t>(dims.back());
  if (n == 0 || (n & (n - 1)) != 0) {
    return ffi::Error::InvalidArgument("rfjax fwht: the last dimension must be a power of two");
  }
  run<T>(&pool, x.typed_data(), y->typed_data(), n, count / n, normalize, max_threads);
  return ffi::Error::Success();
}

ffi::Error fwht_f32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                    ffi::ResultBuffer<ffi::F32> y, bool normalize, int64_t max_threads) {
  return fwht_impl<ffi::F32>(pool, x, y, normalize, max_threads);
}

ffi::Error fwht_f64(ffi::ThreadPool pool, ffi::Buffer<ffi::F64> x,
                    ffi::ResultBuffer<ffi::F64> y, bool normalize, int64_t max_threads) {
  return fwht_impl<ffi::F64>(pool, x, y, normalize, max_threads);
}

// ---------------------------------------------------------------------------------------------
// The structured-coupling chain, fused (fwht_kernel.h: hd_chain_rows), rows over the pool.
// ---------------------------------------------------------------------------------------------

template <ffi::DataType DT>
ffi::Error hd_chain_impl(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> signs,
                         ffi::Buffer<DT> norms, ffi::ResultBuffer<DT> y, bool simplex,
                         ffi::Span<const ffi::NativeType<DT>> simplex_terms) {
  using T = ffi::NativeType<DT>;
  const auto sign_dims = signs.dimensions();
  const size_t count = x.element_count();
  if (x.dimensions().size() == 0 || sign_dims.size() != 3 || simplex_terms.size() != 3) {
    return ffi::Error::InvalidArgument("rfjax hd_chain: x (..., p), signs (B, k, p), 3 terms");
  }
  const size_t p = static_cast<size_t>(x.dimensions().back());
  const size_t blocks = static_cast<size_t>(sign_dims[0]);
  const size_t rotations = static_cast<size_t>(sign_dims[1]);
  if (count == 0 || blocks == 0) return ffi::Error::Success();
  if ((p & (p - 1)) != 0 || static_cast<size_t>(sign_dims[2]) != p) {
    return ffi::Error::InvalidArgument("rfjax hd_chain: p must be a power of two, signs' last");
  }
  const size_t rows = count / p;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(p)));
  const Kernel* kernel = active_kernel().load(std::memory_order_relaxed);
  const auto chain = [&] {
    if constexpr (std::is_same_v<T, float>) {
      return kernel->chain_f32;
    } else {
      return kernel->chain_f64;
    }
  }();
  const T* in = x.typed_data();
  T* out = y->typed_data();
  advise_huge_pages(out, rows * blocks * p * sizeof(T));
  parallel_rows(&pool, rows, blocks * p * (rotations + 1), -1, [&](size_t first, size_t number) {
    chain(in + first * p, signs.typed_data(), norms.typed_data(), out + first * blocks * p, p,
          number, blocks, rotations, scale, simplex, simplex_terms.begin());
  });
  return ffi::Error::Success();
}

ffi::Error hd_chain_f32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> signs,
                        ffi::Buffer<ffi::F32> norms, ffi::ResultBuffer<ffi::F32> y, bool simplex,
                        ffi::Span<const float> simplex_terms) {
  return hd_chain_impl<ffi::F32>(pool, x, signs, norms, y, simplex, simplex_terms);
}

ffi::Error hd_chain_f64(ffi::ThreadPool pool, ffi::Buffer<ffi::F64> x, ffi::Buffer<ffi::F64> signs,
                        ffi::Buffer<ffi::F64> norms, ffi::ResultBuffer<ffi::F64> y, bool simplex,
                        ffi::Span<const double> simplex_terms) {
  return hd_chain_impl<ffi::F64>(pool, x, signs, norms, y, simplex, simplex_terms);
}

// ---------------------------------------------------------------------------------------------
// scale * [sin t, cos t] of the rows of t (sincos_kernel.h), the constants passed by the caller.
// ---------------------------------------------------------------------------------------------

template <class T>
bool sin_cos_rows(const T* t, T* y, size_t m, size_t rows, ffi::Span<const T> split,
                  ffi::Span<const T> sine, ffi::Span<const T> cosine, T limit, T scale) {
  const Kernel* kernel = active_kernel().load(std::memory_order_relaxed);
  const auto function = [&] {
    if constexpr (std::is_same_v<T, float>) {
      return kernel->sin_cos_f32;
    } else {
      return kernel->sin_cos_f64;
    }
  }();
  return function(t, y, m, rows, split.begin(), sine.begin(), static_cast<int>(sine.size()),
                  cosine.begin(), static_cast<int>(cosine.size()), limit, scale);
}

template <ffi::DataType DT>
ffi::Error sin_cos_impl(ffi::ThreadPool pool, ffi::Buffer<DT> t, ffi::ResultBuffer<DT> y,
                        ffi::Span<const ffi::NativeType<DT>> split,
                        ffi::Span<const ffi::NativeType<DT>> sine,
                        ffi::Span<const ffi::NativeType<DT>> cosine, ffi::NativeType<DT> limit,
                        ffi::NativeType<DT> scale) {
  using T = ffi::NativeType<DT>;
  const auto dims = t.dimensions();
  const size_t count = t.element_count();
  if (count == 0) return ffi::Error::Success();
  if (dims.size() == 0 || split.size() != 3) {
    return ffi::Error::InvalidArgument("rfjax sin_cos: t must have rank >= 1, split 3 values");
  }
  const size_t m = static_cast<size_t>(dims.back());
  const size_t rows = count / m;
  const T* in = t.typed_data();
  T* out = y->typed_data();
  advise_huge_pages(out, 2 * count * sizeof(T));
  std::atomic<bool> ok{true};
  parallel_rows(&pool, rows, 2 * m, -1, [&](size_t first, size_t number) {
    if (!sin_cos_rows<T>(in + first * m, out + first * 2 * m, m, number, split, sine, cosine,
                         limit, scale)) {
      ok.store(false, std::memory_order_relaxed);
    }
  });
  if (!ok.load()) {
    return ffi::Error::InvalidArgument(
        "rfjax sin_cos: the numbers of polynomial coefficients are not the compiled ones");
  }
  return ffi::Error::Success();
}

ffi::Error sin_cos_f32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> t, ffi::ResultBuffer<ffi::F32> y,
                       ffi::Span<const float> split, ffi::Span<const float> sine,
                       ffi::Span<const float> cosine, float limit, float scale) {
  return sin_cos_impl<ffi::F32>(pool, t, y, split, sine, cosine, limit, scale);
}

ffi::Error sin_cos_f64(ffi::ThreadPool pool, ffi::Buffer<ffi::F64> t, ffi::ResultBuffer<ffi::F64> y,
                       ffi::Span<const double> split, ffi::Span<const double> sine,
                       ffi::Span<const double> cosine, double limit, double scale) {
  return sin_cos_impl<ffi::F64>(pool, t, y, split, sine, cosine, limit, scale);
}

// ---------------------------------------------------------------------------------------------
// The Gram matrix update G += Phi^T Phi by BLAS syrk (a symmetric rank-k product: one triangle,
// half the work of a general product). The BLAS is SciPy's, whose Fortran-interface functions
// the Python side hands over once (rfjax_set_syrk), as jaxlib does for its LAPACK kernels; the
// library itself links no BLAS.
// ---------------------------------------------------------------------------------------------

template <class T>
using Syrk = void (*)(const char* uplo, const char* trans, const int* n, const int* k,
                      const T* alpha, const T* a, const int* lda, const T* beta, T* c,
                      const int* ldc);

template <class T>
std::atomic<Syrk<T>>& syrk_function() {
  static std::atomic<Syrk<T>> function{nullptr};
  return function;
}

// gram (m x m, row-major) + phi^T phi (phi: b x m, row-major) into out, which aliases gram. The
// row-major phi is the column-major m x b matrix A, so A A^T = phi^T phi, and the triangle syrk
// updates ('U' in column-major) is the lower triangle j <= i of the row-major result; the strict
// upper triangle is left as it was.
template <ffi::DataType DT>
ffi::Error gram_update_impl(ffi::Buffer<DT> gram, ffi::Buffer<DT> phi, ffi::ResultBuffer<DT> out) {
  using T = ffi::NativeType<DT>;
  const auto phi_dims = phi.dimensions();
  const auto gram_dims = gram.dimensions();
  if (phi_dims.size() != 2 || gram_dims.size() != 2 || gram_dims[0] != phi_dims[1] ||
      gram_dims[1] != phi_dims[1]) {
    return ffi::Error::InvalidArgument("rfjax gram_update: gram must be (m, m) for phi (b, m)");
  }
  const Syrk<T> syrk = syrk_function<T>().load();
  if (syrk == nullptr) {
    return ffi::Error::Internal("rfjax gram_update: no BLAS syrk was set (rfjax_set_syrk)");
  }
  if (phi_dims[0] > INT32_MAX || phi_dims[1] > INT32_MAX) {
    return ffi::Error::InvalidArgument("rfjax gram_update: dimensions beyond BLAS's int");
  }
  if (out->typed_data() != gram.typed_data()) {  // XLA aliases them; copy if it did not
    std::memcpy(out->typed_data(), gram.typed_data(), gram.element_count() * sizeof(T));
  }
  const int m = static_cast<int>(phi_dims[1]);
  const int b = static_cast<int>(phi_dims[0]);
  if (m == 0 || b == 0) return ffi::Error::Success();
  const T one = 1;
  syrk("U", "N", &m, &b, &one, phi.typed_data(), &m, &one, out->typed_data(), &m);
  return ffi::Error::Success();
}

ffi::Error gram_update_f32(ffi::Buffer<ffi::F32> gram, ffi::Buffer<ffi::F32> phi,
                           ffi::ResultBuffer<ffi::F32> out) {
  return gram_update_impl<ffi::F32>(gram, phi, out);
}

ffi::Error gram_update_f64(ffi::Buffer<ffi::F64> gram, ffi::Buffer<ffi::F64> phi,
                           ffi::ResultBuffer<ffi::F64> out) {
  return gram_update_impl<ffi::F64>(gram, phi, out);
}

}  // namespace

#if defined(_WIN32)
#define RFJAX_EXPORT __declspec(dllexport)
#else
#define RFJAX_EXPORT __attribute__((visibility("default")))
#endif

// The handlers are looked up by name (ctypes) and must stay visible under -fvisibility=hidden.
extern "C" {
RFJAX_EXPORT XLA_FFI_Error* RfjaxFwhtF32(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxFwhtF64(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxHdChainF32(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxHdChainF64(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxSinCosF32(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxSinCosF64(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxGramUpdateF32(XLA_FFI_CallFrame* call_frame);
RFJAX_EXPORT XLA_FFI_Error* RfjaxGramUpdateF64(XLA_FFI_CallFrame* call_frame);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxFwhtF32, fwht_f32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("normalize")
                                  .Attr<int64_t>("max_threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxFwhtF64, fwht_f64,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<bool>("normalize")
                                  .Attr<int64_t>("max_threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxHdChainF32, hd_chain_f32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("simplex")
                                  .Attr<ffi::Span<const float>>("simplex_terms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxHdChainF64, hd_chain_f64,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<bool>("simplex")
                                  .Attr<ffi::Span<const double>>("simplex_terms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxSinCosF32, sin_cos_f32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<ffi::Span<const float>>("split")
                                  .Attr<ffi::Span<const float>>("sine")
                                  .Attr<ffi::Span<const float>>("cosine")
                                  .Attr<float>("limit")
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxSinCosF64, sin_cos_f64,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<ffi::Span<const double>>("split")
                                  .Attr<ffi::Span<const double>>("sine")
                                  .Attr<ffi::Span<const double>>("cosine")
                                  .Attr<double>("limit")
                                  .Attr<double>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxGramUpdateF32, gram_update_f32,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(RfjaxGramUpdateF64, gram_update_f64,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>());

// Sets the BLAS syrk functions (Fortran interface, 32-bit integers, as SciPy's cython_blas
// exports them) that the Gram update calls.
extern "C" RFJAX_EXPORT void rfjax_set_syrk(void* ssyrk, void* dsyrk) {
  syrk_function<float>().store(reinterpret_cast<Syrk<float>>(ssyrk));
  syrk_function<double>().store(reinterpret_cast<Syrk<double>>(dsyrk));
}

// Plain C entry point for tests and benchmarks outside XLA (single-threaded, no FFI).
extern "C" RFJAX_EXPORT int rfjax_fwht_f32_rows(const float* in, float* out, size_t n,
                                                size_t rows, int normalize) {
  if (n == 0 || (n & (n - 1)) != 0) return 1;
  run<float>(nullptr, in, out, n, rows, normalize != 0, 0);
  return 0;
}

// The instruction set in use ("avx512", "avx2", "sse2" or "scalar").
extern "C" RFJAX_EXPORT const char* rfjax_fwht_isa() {
  return active_kernel().load()->name;
}

// The compiled instruction sets, best first, comma-separated.
extern "C" RFJAX_EXPORT const char* rfjax_fwht_compiled_isas() {
  static const std::string names = [] {
    std::string joined;
    for (const Kernel& kernel : kKernels) {
      if (!joined.empty()) joined += ",";
      joined += kernel.name;
    }
    return joined;
  }();
  return names.c_str();
}

// Switches to the named instruction set: 0 on success, 1 if it was not compiled, 2 if this CPU
// does not support it. For tests; calls already running finish with the previous one.
extern "C" RFJAX_EXPORT int rfjax_fwht_select_isa(const char* name) {
  const Kernel* kernel = find_kernel(name);
  if (kernel == nullptr) return 1;
  if (!cpu_supports(*kernel)) return 2;
  active_kernel().store(kernel);
  return 0;
}
