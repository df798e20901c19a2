// Device-side fp16/bf16 conversions: dk::float_to_half / float_to_bf16 / half_to_float /
// bf16_to_float (dtype.h, compiled for the device) must agree with the CUDA intrinsics
// __float2half_rn / __float2bfloat16_rn / __half2float / __bfloat162float (which
// vec.cuh's Conv<__half> / Conv<__nv_bfloat16> use) on every one of the 2^32 fp32 bit
// patterns (a NaN must give a NaN; sign and payload are free: on the H200 the intrinsics gave
// the canonical 0x7fff for every NaN, where dtype.h keeps the sign), and with the host build
// of dtype.h (checked against a double-precision reference by test_dtype) on a strided sample.
// fp8 e4m3 -> fp32 (fp8.h: the hardware conversion on the device, a bit path on the host) must
// agree bitwise on all 256 codes (NaN: any NaN).
// Exits 77 (skipped) without an sm_90 GPU.
#include "cuda_util.h"
#include "decodekit/common/fp8.h"

using namespace dk_test;

namespace {

__device__ bool nan16(uint16_t h, bool is_half) {
  return is_half ? (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) : (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

// counts[0]: fp16 mismatches, counts[1]: bf16 mismatches; first[]: first mismatching input.
__global__ void all_floats(unsigned long long* counts, unsigned* first) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (uint64_t(1) << 32);
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float f = __uint_as_float(uint32_t(i));
    const uint16_t h = dk::float_to_half(f), hr = __half_as_ushort(__float2half_rn(f));
    const bool nan = f != f;
    const bool ok_h = nan ? nan16(h, true) && nan16(hr, true) : h == hr;
    if (!ok_h && atomicAdd(&counts[0], 1ull) == 0) first[0] = uint32_t(i);
    const uint16_t b = dk::float_to_bf16(f), br = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    const bool ok_b = nan ? nan16(b, false) && nan16(br, false) : b == br;
    if (!ok_b && atomicAdd(&counts[1], 1ull) == 0) first[1] = uint32_t(i);
  }
}

// counts[2]/[3]: 16-bit patterns whose decoded value differs (bitwise; NaN: any NaN).
__global__ void all_halves(unsigned long long* counts) {
  const uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= 65536) return;
  const float a = dk::half_to_float(uint16_t(u)), ar = __half2float(__ushort_as_half(uint16_t(u)));
  if (!((a != a && ar != ar) || __float_as_uint(a) == __float_as_uint(ar))) atomicAdd(&counts[2], 1ull);
  const float b = dk::bf16_to_float(uint16_t(u)), br = __bfloat162float(__ushort_as_bfloat16(uint16_t(u)));
  if (!((b != b && br != br) || __float_as_uint(b) == __float_as_uint(br))) atomicAdd(&counts[3], 1ull);
}

// Device dk conversions of a strided sample, for comparison with the host build.
__global__ void sample(uint64_t n, uint32_t stride, uint16_t* h, uint16_t* b) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const float f = __uint_as_float(uint32_t(i * stride));
    h[i] = dk::float_to_half(f);
    b[i] = dk::float_to_bf16(f);
  }
}

__global__ void all_fp8(float* out) {  // 256 threads: code threadIdx.x
  out[threadIdx.x] = dk::fp8_e4m3_to_float(uint8_t(threadIdx.x));
}

}  // namespace

int main() {
  require_gpu_or_skip("test_dtype_cuda");
  unsigned long long* d_counts;
  unsigned* d_first;
  CUDA_OK(cudaMalloc(&d_counts, 4 * sizeof(unsigned long long)));
  CUDA_OK(cudaMalloc(&d_first, 2 * sizeof(unsigned)));
  CUDA_OK(cudaMemset(d_counts, 0, 4 * sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(d_first, 0, 2 * sizeof(unsigned)));
  all_floats<<<4096, 256>>>(d_counts, d_first);
  all_halves<<<256, 256>>>(d_counts);
  CUDA_OK(cudaGetLastError());
  unsigned long long counts[4];
  unsigned first[2];
  CUDA_OK(cudaMemcpy(counts, d_counts, sizeof counts, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(first, d_first, sizeof first, cudaMemcpyDeviceToHost));
  n_checks() += 2 * (int64_t(1) << 32) + 2 * 65536 - 4;
  CHECK(counts[0] == 0) << "float_to_half vs __float2half_rn:" << counts[0] << "mismatches, first input bits"
                        << first[0];
  CHECK(counts[1] == 0) << "float_to_bf16 vs __float2bfloat16_rn:" << counts[1] << "mismatches, first input bits"
                        << first[1];
  CHECK(counts[2] == 0) << "half_to_float vs __half2float:" << counts[2] << "mismatches";
  CHECK(counts[3] == 0) << "bf16_to_float vs __bfloat162float:" << counts[3] << "mismatches";

  const uint32_t stride = 4099;  // odd: every low-bit pattern occurs
  const uint64_t n = ((uint64_t(1) << 32) - 1) / stride + 1;
  uint16_t *d_h, *d_b;
  CUDA_OK(cudaMalloc(&d_h, n * 2));
  CUDA_OK(cudaMalloc(&d_b, n * 2));
  sample<<<1024, 256>>>(n, stride, d_h, d_b);
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> h(n), b(n);
  CUDA_OK(cudaMemcpy(h.data(), d_h, n * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(b.data(), d_b, n * 2, cudaMemcpyDeviceToHost));
  long long bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const float f = dk::bits_to_float(uint32_t(i * stride));
    bad += h[i] != dk::float_to_half(f) || b[i] != dk::float_to_bf16(f);  // identical code: NaNs equal too
  }
  n_checks() += int64_t(n) - 1;
  CHECK(bad == 0) << bad << "of" << n << "sampled conversions differ between the device and host builds";

  float* d_f8;
  CUDA_OK(cudaMalloc(&d_f8, 256 * sizeof(float)));
  all_fp8<<<1, 256>>>(d_f8);
  CUDA_OK(cudaGetLastError());
  std::vector<float> f8(256);
  CUDA_OK(cudaMemcpy(f8.data(), d_f8, 256 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int c = 0; c < 256; ++c) {
    const float want = dk::fp8_e4m3_to_float(uint8_t(c));
    ++n_checks();
    CHECK((want != want && f8[c] != f8[c]) || dk::float_to_bits(want) == dk::float_to_bits(f8[c]))
        << "fp8 e4m3 code" << c << ": device" << f8[c] << "host" << want;
  }
  cudaFree(d_f8);
  cudaFree(d_counts);
  cudaFree(d_first);
  cudaFree(d_h);
  cudaFree(d_b);
  return finish("test_dtype_cuda");
}
