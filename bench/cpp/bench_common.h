// Microbenchmark harness for bench/cpp/bench_*.cpp (CPU) and bench_*.cu (CUDA).
//
// Method (both devices):
//  - Every call works on its own "slot" of one big arena: rotating buffers, so that the
//    data of one call is not in cache from an earlier one. The arena is >= 4x the
//    last-level cache (CPU: LLC size from sysconf; GPU: max(L2, 60 MB)), or one slot when
//    a single call needs more than that. It is filled once with values that are normal
//    numbers in fp32, fp16 and bf16 alike (no denormal slow paths, no inf/NaN).
//  - The copy ceiling is measured first: a large copy of half the arena into the other
//    half (CPU: memcpy, split over the OpenMP threads; GPU: cudaMemcpyDeviceToDevice),
//    counted as read + write bytes. Every case reports its fraction of it.
//  - Bytes per call = unique bytes a call must read and write (given by each case).
//  - CPU (std::chrono): warm-up, then batches of back-to-back calls (each call on the
//    next slot, cycling through the whole arena), a batch lasting >= ~1 ms; the time per
//    call is the median over the batches of (batch time / batch size).
//  - GPU (CUDA events): warm-up, then a CUDA graph of K back-to-back launches on K
//    different slots (no launch overhead, as in graph-captured decoding), replayed many
//    times; before each replay a read of a 4x-L2 buffer (outside the timed region)
//    evicts the slots from L2. Time per call = median replay time / K.
//
// Command line: [--quick] [--all] [--json PATH] [--filter SUBSTR] [--budget-ms MS]
//   (default)   GPU: every case. CPU: every case except the "big" ones (4096 tokens in
//               fp32/fp16, and every 4096-token silu_and_mul: up to seconds per call on a
//               small CPU), so that all three CPU binaries take < 60 s on 2 cores.
//   --quick     CI smoke run: bf16 only, no 4096-token cases, fewer repeats
//   --all       CPU: also the big cases
//   --json      write all results as a JSON list of
//               {bench, case, dtype, time_us, gbps, frac_of_copy, tflops, device}
//               (tflops: compute cases, e.g. prefill attention; 0 for bandwidth cases)
//   --filter    only cases whose "bench case dtype" contains SUBSTR
//   --budget-ms time per case (default CPU 100, GPU 40; --quick: 15 / 10)
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>
#include <unistd.h>

#include "decodekit/common/dtype.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace dkb {

// ---- shapes shared by the benchmarks -------------------------------------------------

// tokens x hidden: SmolLM2-135M (576), Llama-3-8B (4096), Llama-3-70B (8192)
inline const std::vector<int64_t>& bench_tokens(bool quick) {
  static const std::vector<int64_t> all{1, 16, 256, 4096}, smoke{1, 16, 256};
  return quick ? smoke : all;
}
inline const std::vector<int>& bench_hidden() { static const std::vector<int> h{576, 4096, 8192}; return h; }

template <class T> struct DtypeName;
template <> struct DtypeName<float> { static constexpr const char* value = "fp32"; };
template <> struct DtypeName<dk::half_t> { static constexpr const char* value = "fp16"; };
template <> struct DtypeName<dk::bf16_t> { static constexpr const char* value = "bf16"; };

// ---- options -----------------------------------------------------------------------------

struct Options {
  bool quick = false, all = false;
  std::string json, filter;
  double budget_ms = -1;  // per case; < 0: default for the device
};

inline Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--quick") o.quick = true;
    else if (a == "--all") o.all = true;
    else if (a == "--json") o.json = value();
    else if (a == "--filter") o.filter = value();
    else if (a == "--budget-ms") o.budget_ms = std::atof(value().c_str());
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--all] [--json PATH] [--filter SUBSTR] [--budget-ms MS]\n", argv[0]);
      std::exit(a == "-h" || a == "--help" ? 0 : 2);
    }
  }
  return o;
}

// ---- cases and results -------------------------------------------------------------------

// One benchmark case: a kernel call that takes its buffers from one arena slot.
struct Case {
  std::string bench;  // kernel, e.g. "rms_norm"
  std::string shape;  // e.g. "tokens=16 hidden=4096"
  std::string dtype;  // fp32 / fp16 / bf16
  double bytes = 0;   // unique bytes read + written by one call
  double flops = 0;   // useful floating-point operations of one call (0: a bandwidth case)
  size_t slot_bytes = 0;  // arena bytes one call uses (see Carver)
  bool big = false;       // skipped by the default CPU run (see --all)
  std::function<void(char* slot)> cpu;
#if defined(__CUDACC__)
  std::function<cudaError_t(char* slot, cudaStream_t stream)> gpu;
#endif
};

// Lays out a call's buffers inside a slot, each 256-byte aligned. The same sequence of
// take() calls first sizes the slot (base = nullptr) and then hands out pointers.
struct Carver {
  char* base = nullptr;
  size_t used = 0;
  template <class T> T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (size_t(n) * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

struct Result {
  std::string bench, cas, dtype, device;
  double time_us, gbps, frac;
  double tflops = 0;  // flops / time for compute cases (compare with the measured matmul rate)
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline void fill_pattern(uint16_t* p, size_t n, uint64_t seed) {
  // 0x3800 | 10 random bits | random sign: fp16 in +-[0.5, 1), bf16 in +-[2^-15, 2^-8),
  // and any two of them as an fp32 in +-[2^-15, 2^-8): normal numbers in every dtype.
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r = uint32_t(s >> 40);
    p[i] = uint16_t(0x3800u | (r & 0x3ffu) | ((r >> 10) & 1u) << 15);
  }
}

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (uint8_t(c) >= 0x20) o += c;
  }
  return o;
}

inline void write_json(const std::string& path, const std::vector<Result>& rs) {
  if (path.empty()) return;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) { std::fprintf(stderr, "cannot write %s\n", path.c_str()); std::exit(1); }
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    std::fprintf(f,
                 "  {\"bench\": \"%s\", \"case\": \"%s\", \"dtype\": \"%s\", \"time_us\": %.4f, \"gbps\": %.3f, "
                 "\"frac_of_copy\": %.4f, \"tflops\": %.3f, \"device\": \"%s\"}%s\n",
                 json_escape(r.bench).c_str(), json_escape(r.cas).c_str(), json_escape(r.dtype).c_str(), r.time_us,
                 r.gbps, r.frac, r.tflops, json_escape(r.device).c_str(), i + 1 < rs.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  std::fclose(f);
  std::printf("wrote %s (%zu results)\n", path.c_str(), rs.size());
}

inline void print_result(const Result& r, const std::string& shape) {
  std::printf("%-20s %-30s %-5s %11.2f us %9.2f GB/s %6.3f of copy", r.bench.c_str(), shape.c_str(), r.dtype.c_str(),
              r.time_us, r.gbps, r.frac);
  if (r.tflops > 0) std::printf(" %8.2f TFLOP/s", r.tflops);
  std::printf("\n");
  std::fflush(stdout);
}

inline bool selected(const Options& o, const Case& c) {
  return o.filter.empty() || (c.bench + " " + c.shape + " " + c.dtype).find(o.filter) != std::string::npos;
}

inline size_t max_slot(const std::vector<Case>& cases) {
  size_t m = 0;
  for (const Case& c : cases) m = std::max(m, c.slot_bytes);
  return m;
}

// ---- CPU ---------------------------------------------------------------------------------

inline std::string cpu_name() {
  std::string name = "cpu";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "model name", 10) == 0) {
        const char* p = std::strchr(line, ':');
        if (p) { name = p + 2; name.erase(name.find_last_not_of("\n ") + 1); }
        break;
      }
    }
    std::fclose(f);
  }
  int threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  return "cpu: " + name + " (" + std::to_string(threads) + " threads)";
}

inline size_t cpu_llc_bytes() {
  long llc = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return llc > 0 ? size_t(llc) : size_t(32) << 20;
}

using clock_type = std::chrono::steady_clock;
inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// memcpy split over the OpenMP threads (each copies a contiguous chunk).
inline void parallel_memcpy(char* dst, const char* src, size_t n) {
#pragma omp parallel
  {
    int nt = 1, t = 0;
#if defined(_OPENMP)
    nt = omp_get_num_threads();
    t = omp_get_thread_num();
#endif
    const size_t chunk = (n / nt + 4095) / 4096 * 4096;
    const size_t b = std::min(n, size_t(t) * chunk), e = std::min(n, b + chunk);
    if (e > b) std::memcpy(dst + b, src + b, e - b);
  }
}

inline int run_cpu(int argc, char** argv, const char* title, const std::function<std::vector<Case>(bool quick)>& make) {
  const Options opt = parse_args(argc, argv);
  std::vector<Case> cases;
  for (Case& c : make(opt.quick))
    if (selected(opt, c) && (opt.all || !c.big)) cases.push_back(std::move(c));
  const double budget = (opt.budget_ms > 0 ? opt.budget_ms : opt.quick ? 15 : 100) * 1e-3;
  const std::string device = cpu_name();
  const size_t llc = cpu_llc_bytes();
  const size_t arena_bytes = std::max({4 * llc, size_t(256) << 20, max_slot(cases)}) / 4096 * 4096 + 4096;
  char* arena = static_cast<char*>(std::aligned_alloc(4096, arena_bytes));
  if (!arena) { std::fprintf(stderr, "cannot allocate %zu MB\n", arena_bytes >> 20); return 1; }
  const auto t_start = clock_type::now();
  {
    uint16_t* a16 = reinterpret_cast<uint16_t*>(arena);
    const size_t n = arena_bytes / 2, chunk = size_t(1) << 20;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t((n + chunk - 1) / chunk); ++i)
      fill_pattern(a16 + i * chunk, std::min(chunk, n - i * chunk), uint64_t(i) + 1);
  }
  std::printf("%s on %s; LLC %zu MB, arena %zu MB%s\n", title, device.c_str(), llc >> 20, arena_bytes >> 20,
              opt.all || opt.quick ? "" : " (big cases skipped: --all)");

  std::vector<Result> results;
  // Copy ceiling: half the arena into the other half, read + write bytes.
  double copy_gbps;
  {
    const size_t half = arena_bytes / 2 / 4096 * 4096;
    parallel_memcpy(arena + half, arena, half);  // warm-up
    std::vector<double> ts;
    for (int r = 0; r < (opt.quick ? 3 : 7); ++r) {
      const auto t0 = clock_type::now();
      parallel_memcpy(r % 2 ? arena : arena + half, r % 2 ? arena + half : arena, half);
      ts.push_back(seconds_since(t0));
    }
    const double t = median(ts);
    copy_gbps = 2.0 * double(half) / t * 1e-9;
    Result r{"copy", "memcpy " + std::to_string(half >> 20) + " MB", "u8", device, t * 1e6, copy_gbps, 1.0};
    print_result(r, r.cas);
    results.push_back(r);
  }

  for (const Case& c : cases) {
    const size_t nslots = std::max<size_t>(1, arena_bytes / c.slot_bytes);
    size_t slot = 0;
    auto call = [&] {
      c.cpu(arena + slot * c.slot_bytes);
      if (++slot == nslots) slot = 0;
    };
    call();  // warm-up
    // One call's time, then batches of >= ~1 ms; at least 5 batches (3 for calls over
    // 50 ms or with --quick), more while the budget lasts.
    auto t0 = clock_type::now();
    call();
    const double t1 = std::max(seconds_since(t0), 1e-8);
    const int64_t batch = std::max<int64_t>(1, int64_t(1e-3 / t1));
    const double min_reps = opt.quick || t1 > 50e-3 ? 3.0 : 5.0;
    const int reps = int(std::min(101.0, std::max(min_reps, budget / (double(batch) * t1))));
    std::vector<double> per_call;
    for (int r = 0; r < reps; ++r) {
      t0 = clock_type::now();
      for (int64_t b = 0; b < batch; ++b) call();
      per_call.push_back(seconds_since(t0) / double(batch));
    }
    const double t = median(per_call);
    const double gbps = c.bytes / t * 1e-9;
    Result r{c.bench, c.shape, c.dtype, device, t * 1e6, gbps, gbps / copy_gbps, c.flops / t * 1e-12};
    print_result(r, c.shape);
    results.push_back(r);
  }
  std::printf("%zu cases in %.1f s\n", cases.size(), seconds_since(t_start));
  write_json(opt.json, results);
  std::free(arena);
  return 0;
}

// ---- CUDA --------------------------------------------------------------------------------

#if defined(__CUDACC__)

template <class T> struct DevType { using type = T; };
template <> struct DevType<dk::half_t> { using type = __half; };
template <> struct DevType<dk::bf16_t> { using type = __nv_bfloat16; };
template <class T> using cuda_t = typename DevType<T>::type;

#define DKB_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                    \
    const cudaError_t e_ = (expr);                                                                        \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));         \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

// Reads n 16-byte words; the store never happens but keeps the loads alive.
__global__ void dkb_flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Returns 77 (skip) when there is no usable GPU.
inline int run_gpu(int argc, char** argv, const char* title, const std::function<std::vector<Case>(bool quick)>& make) {
  const Options opt = parse_args(argc, argv);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  std::vector<Case> cases;
  for (Case& c : make(opt.quick))
    if (selected(opt, c)) cases.push_back(std::move(c));
  const double budget = (opt.budget_ms > 0 ? opt.budget_ms : opt.quick ? 10 : 40) * 1e-3;
  cudaDeviceProp prop;
  DKB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::string device = std::string("cuda: ") + prop.name;
  const size_t l2 = std::max<size_t>(size_t(prop.l2CacheSize), size_t(60) << 20);
  const size_t arena_bytes = std::max({4 * l2, max_slot(cases)}) / 4096 * 4096 + 4096;
  const auto t_start = clock_type::now();
  char* arena = nullptr;
  uint4* flush = nullptr;
  unsigned* sink = nullptr;
  DKB_CUDA_CHECK(cudaMalloc(&arena, arena_bytes));
  DKB_CUDA_CHECK(cudaMalloc(&flush, 4 * l2));
  DKB_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  DKB_CUDA_CHECK(cudaMemset(flush, 0, 4 * l2));
  {
    const size_t chunk = size_t(32) << 20;
    std::vector<uint16_t> host(chunk / 2);
    fill_pattern(host.data(), host.size(), 1);
    for (size_t off = 0; off < arena_bytes; off += chunk)
      DKB_CUDA_CHECK(cudaMemcpy(arena + off, host.data(), std::min(chunk, arena_bytes - off), cudaMemcpyHostToDevice));
  }
  cudaStream_t stream;
  DKB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int nflush_blocks = prop.multiProcessorCount * 4;
  auto flush_l2 = [&] {
    dkb_flush_kernel<<<nflush_blocks, 512, 0, stream>>>(flush, 4 * l2 / sizeof(uint4), sink);
  };
  std::printf("%s on %s; L2 %d MB, arena %zu MB\n", title, device.c_str(), prop.l2CacheSize >> 20, arena_bytes >> 20);

  constexpr int kMaxEvents = 256;
  std::vector<cudaEvent_t> ev(2 * kMaxEvents);
  for (auto& e : ev) DKB_CUDA_CHECK(cudaEventCreate(&e));
  auto elapsed_s = [&](int i) {
    float ms = 0;
    DKB_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    return double(ms) * 1e-3;
  };

  std::vector<Result> results;
  double copy_gbps;
  {
    const size_t half = arena_bytes / 2 / 4096 * 4096;
    DKB_CUDA_CHECK(cudaMemcpyAsync(arena + half, arena, half, cudaMemcpyDeviceToDevice, stream));  // warm-up
    const int reps = opt.quick ? 5 : 20;
    for (int r = 0; r < reps; ++r) {
      DKB_CUDA_CHECK(cudaEventRecord(ev[2 * r], stream));
      DKB_CUDA_CHECK(cudaMemcpyAsync(r % 2 ? arena : arena + half, r % 2 ? arena + half : arena, half,
                                     cudaMemcpyDeviceToDevice, stream));
      DKB_CUDA_CHECK(cudaEventRecord(ev[2 * r + 1], stream));
    }
    DKB_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> ts;
    for (int r = 0; r < reps; ++r) ts.push_back(elapsed_s(r));
    const double t = median(ts);
    copy_gbps = 2.0 * double(half) / t * 1e-9;
    Result r{"copy", "cudaMemcpyDeviceToDevice " + std::to_string(half >> 20) + " MB", "u8", device, t * 1e6,
             copy_gbps, 1.0};
    print_result(r, r.cas);
    results.push_back(r);
  }

  for (const Case& c : cases) {
    const size_t nslots = std::max<size_t>(1, arena_bytes / c.slot_bytes);
    auto slot = [&](size_t k) { return arena + (k % nslots) * c.slot_bytes; };
    // Warm-up (also loads the module), then a cold single-call estimate.
    DKB_CUDA_CHECK(c.gpu(slot(0), stream));
    DKB_CUDA_CHECK(c.gpu(slot(1), stream));
    std::vector<double> single;
    for (int i = 0; i < 3; ++i) {
      flush_l2();
      DKB_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
      DKB_CUDA_CHECK(c.gpu(slot(i), stream));
      DKB_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
    }
    DKB_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < 3; ++i) single.push_back(elapsed_s(i));
    const double t1 = std::max(*std::min_element(single.begin(), single.end()), 1e-7);
    // K launches on K distinct slots per graph, ~>= 200 us per replay.
    const int64_t K = std::max<int64_t>(1, std::min<int64_t>({int64_t(std::ceil(200e-6 / t1)), int64_t(nslots), 512}));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    DKB_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int64_t k = 0; k < K; ++k) {
      const cudaError_t e = c.gpu(slot(size_t(k)), stream);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "%s %s: launch failed during capture: %s\n", c.bench.c_str(), c.shape.c_str(),
                     cudaGetErrorString(e));
        std::exit(1);
      }
    }
    DKB_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DKB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    DKB_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up replay
    const double flush_s = 4.0 * double(l2) / (copy_gbps * 0.5e9);
    const int reps = int(std::min<double>(kMaxEvents, std::max(opt.quick ? 5.0 : 15.0, budget / (double(K) * t1 + flush_s))));
    for (int r = 0; r < reps; ++r) {
      flush_l2();
      DKB_CUDA_CHECK(cudaEventRecord(ev[2 * r], stream));
      DKB_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      DKB_CUDA_CHECK(cudaEventRecord(ev[2 * r + 1], stream));
    }
    DKB_CUDA_CHECK(cudaStreamSynchronize(stream));
    DKB_CUDA_CHECK(cudaGetLastError());
    std::vector<double> per_call;
    for (int r = 0; r < reps; ++r) per_call.push_back(elapsed_s(r) / double(K));
    DKB_CUDA_CHECK(cudaGraphExecDestroy(exec));
    DKB_CUDA_CHECK(cudaGraphDestroy(graph));
    const double t = median(per_call);
    const double gbps = c.bytes / t * 1e-9;
    Result r{c.bench, c.shape, c.dtype, device, t * 1e6, gbps, gbps / copy_gbps, c.flops / t * 1e-12};
    print_result(r, c.shape);
    results.push_back(r);
  }
  std::printf("%zu cases in %.1f s\n", cases.size(), seconds_since(t_start));
  write_json(opt.json, results);
  for (auto& e : ev) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  cudaFree(arena);
  cudaFree(flush);
  cudaFree(sink);
  return 0;
}

#endif  // __CUDACC__

}  // namespace dkb

// Defines make_cases() (bf16 always, fp32 and fp16 unless --quick) from a per-file
// template add_cases<T>(cases, quick), and main() for the CPU build or, compiled as CUDA
// (the .cu files include the .cpp), the GPU build named NAME "_cuda".
#if defined(__CUDACC__)
#define DKB_RUN(argc, argv, NAME, MAKE) dkb::run_gpu(argc, argv, NAME "_cuda", MAKE)
#else
#define DKB_RUN(argc, argv, NAME, MAKE) dkb::run_cpu(argc, argv, NAME, MAKE)
#endif
#define DKB_BENCH_MAIN(NAME, ADD_CASES)                              \
  static std::vector<dkb::Case> dkb_make_cases(bool quick) {          \
    std::vector<dkb::Case> cases;                                     \
    if (!quick) {                                                     \
      ADD_CASES<float>(cases, quick);                                 \
      ADD_CASES<dk::half_t>(cases, quick);                            \
    }                                                                 \
    ADD_CASES<dk::bf16_t>(cases, quick);                              \
    return cases;                                                     \
  }                                                                   \
  int main(int argc, char** argv) { return DKB_RUN(argc, argv, NAME, dkb_make_cases); }
