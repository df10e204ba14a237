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
// never deadlocks when the pool is busy. Small work runs inline.

#include <algorithm>
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
};

#define RFJAX_KERNEL(isa) \
  Kernel { #isa, rfjax::isa::transform_rows_f32, rfjax::isa::transform_rows_f64 }

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

template <class T>
void run(ffi::ThreadPool* pool, const T* in, T* out, size_t n, size_t rows, bool normalize,
         int64_t max_threads) {
  const bool scaled = normalize && n > 1;
  const T scale = scaled ? static_cast<T>(1.0 / std::sqrt(static_cast<double>(n))) : T(1);
  const size_t total = n * rows;
  int64_t threads = pool != nullptr ? pool->num_threads() : 0;
  // RFJAX_FWHT_CPU_THREADS caps the pool threads used (0: the calling thread only).
  static const int64_t cap = [] {
    const char* env = std::getenv("RFJAX_FWHT_CPU_THREADS");
    return env != nullptr ? std::strtoll(env, nullptr, 10) : int64_t{-1};
  }();
  if (cap >= 0) threads = std::min(threads, cap);
  // The max_threads attribute caps them too (-1: no cap; 0: the calling thread only).
  if (max_threads >= 0) threads = std::min(threads, max_threads);
  if (rows < 2 || total < kParallelMinElements || threads < 1) {
    transform_rows<T>(in, out, n, rows, scaled, scale);
    return;
  }
  const size_t workers = static_cast<size_t>(threads) + 1;  // the pool and the caller
  size_t rows_per_task = std::max<size_t>(1, kTaskElements / n);
  // At least a few tasks per worker for balance, but not smaller than one row.
  rows_per_task = std::min(rows_per_task, std::max<size_t>(1, rows / (4 * workers)));
  auto state = std::make_shared<TaskState>();
  state->num_tasks = (rows + rows_per_task - 1) / rows_per_task;

  auto work = [state, in, out, n, rows, rows_per_task, scaled, scale]() {
    size_t t;
    while ((t = state->next.fetch_add(1, std::memory_order_relaxed)) < state->num_tasks) {
      const size_t r0 = t * rows_per_task;
      const size_t nr = std::min(rows_per_task, rows - r0);
      transform_rows<T>(in + r0 * n, out + r0 * n, n, nr, scaled, scale);
      if (state->done.fetch_add(1, std::memory_order_acq_rel) + 1 == state->num_tasks) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cv.notify_all();
      }
    }
  };
  const size_t helpers = std::min<size_t>(static_cast<size_t>(threads), state->num_tasks - 1);
  for (size_t i = 0; i < helpers; ++i) {
    auto task = work;
    pool->Schedule(std::move(task));
  }
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] {
    return state->done.load(std::memory_order_acquire) == state->num_tasks;
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
