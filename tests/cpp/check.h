// Tiny self-contained test helpers (no gtest): CHECK macros that count failures and keep
// going, a deterministic RNG, NaN poisoning, and the error bounds shared by the tests.
//
//   CHECK(cond) << "context";           // streams extra context on failure
//   CHECK_NEAR(got, want, tol) << ...;   // |got - want| <= tol, NaN fails
//   return dk_test::finish("test_x");    // prints a summary, returns the exit code
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "decodekit/common/dtype.h"

namespace dk_test {

inline long long& n_checks() { static long long n = 0; return n; }
inline long long& n_failures() { static long long n = 0; return n; }
// Print at most this many failure messages (a broken kernel fails on every element).
constexpr long long kMaxPrinted = 20;

// Collects the streamed context of a failed check and prints it on destruction.
class Failure {
 public:
  Failure(const char* file, int line, const std::string& what) {
    ++n_failures();
    printing_ = n_failures() <= kMaxPrinted;
    if (printing_) os_ << file << ":" << line << ": CHECK failed: " << what;
  }
  ~Failure() {
    if (printing_) std::fprintf(stderr, "%s\n", os_.str().c_str());
    else if (n_failures() == kMaxPrinted + 1) std::fprintf(stderr, "(further failures not printed)\n");
  }
  template <class V> Failure& operator<<(const V& v) {
    if (printing_) os_ << " " << v;
    return *this;
  }

 private:
  std::ostringstream os_;
  bool printing_;
};

inline bool count(bool ok) { ++n_checks(); return ok; }

inline std::string near_msg(double got, double want, double tol) {
  std::ostringstream os;
  os.precision(17);
  os << "got " << got << " want " << want << " |diff| " << std::fabs(got - want) << " > tol " << tol;
  return os.str();
}

// Returns 0 when every check passed, 1 otherwise.
inline int finish(const char* name) {
  std::printf("%s: %lld checks, %lld failures -> %s\n", name, n_checks(), n_failures(),
              n_failures() ? "FAIL" : "PASS");
  return n_failures() ? 1 : 0;
}

// Tests CMake also builds for x86-64-v3 (DK_TEST_NEEDS_AVX2: the CPU kernels' AVX2 paths) exit 77
// (ctest: skipped) on a CPU without AVX2 + FMA + F16C instead of dying on an illegal instruction.
inline void skip_without_avx2(const char* name) {
#if defined(DK_TEST_NEEDS_AVX2) && (defined(__x86_64__) || defined(__i386__))
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) {
    std::printf("%s: built for AVX2, this CPU has none: skipped\n", name);
    std::exit(77);
  }
#else
  (void)name;
#endif
}

// xorshift64*: deterministic across platforms (unlike std::*_distribution).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) { next(); }
  uint64_t next() {
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  uint32_t u32() { return uint32_t(next() >> 32); }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }              // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// ---- storage types -------------------------------------------------------------------

template <class T> struct TypeInfo;
// eps: unit roundoff (half an ulp relative, 2^-p for p significant bits);
// tiny: half the smallest positive subnormal (the absolute rounding error floor).
template <> struct TypeInfo<float> {
  static constexpr const char* name = "fp32";
  static constexpr double eps = 0x1.0p-24, tiny = 0x1.0p-150;
};
template <> struct TypeInfo<dk::half_t> {
  static constexpr const char* name = "fp16";
  static constexpr double eps = 0x1.0p-11, tiny = 0x1.0p-25;
};
template <> struct TypeInfo<dk::bf16_t> {
  static constexpr const char* name = "bf16";
  static constexpr double eps = 0x1.0p-8, tiny = 0x1.0p-134;
};

template <class T> inline double to_d(const T& x) { return double(dk::to_float(x)); }
// Round a double to storage type T (via fp32: exact for the values the tests create, which
// are all built from fp32 numbers or are rounded on purpose).
template <class T> inline T from_d(double x) { return dk::from_float<T>(float(x)); }

// A quiet NaN in every storage type: written over outputs before a kernel runs, so an
// element the kernel forgets to write fails every comparison.
template <class T> inline T poison();
template <> inline float poison<float>() { return std::numeric_limits<float>::quiet_NaN(); }
template <> inline dk::half_t poison<dk::half_t>() { return dk::half_t{0x7e00}; }
template <> inline dk::bf16_t poison<dk::bf16_t>() { return dk::bf16_t{0x7fc0}; }

template <class T> inline bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

// Error bound for a value computed in fp32 with relative error <= rel32 (w.r.t. |want|,
// or w.r.t. `scale` when cancellation makes |want| meaningless) and then rounded once to T:
//   |got - want| <= |round_T(v) - v| + |v - want|
//               <= eps_T * |v| + tiny_T + rel32 * scale,   |v| <= |want| + rel32 * scale.
template <class T> inline double store_tol(double want, double rel32, double scale) {
  const double e32 = rel32 * scale;
  return TypeInfo<T>::eps * (std::fabs(want) + e32) + TypeInfo<T>::tiny + e32;
}

}  // namespace dk_test

#define CHECK(cond) \
  if (::dk_test::count(bool(cond))) {} else ::dk_test::Failure(__FILE__, __LINE__, #cond)

#define CHECK_NEAR(got, want, tol)                                                          \
  if (::dk_test::count(std::fabs(double(got) - double(want)) <= double(tol))) {} else       \
    ::dk_test::Failure(__FILE__, __LINE__, #got " ~ " #want) << ::dk_test::near_msg(got, want, tol)
