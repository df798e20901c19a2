// The custom all-reduce protocol of include/decodekit/comm/allreduce.h with std::threads as ranks
// (buffers and Signal blocks in ordinary memory): one-shot and two-shot for 1..4 ranks and awkward
// sizes, bitwise identical results on every rank and the rank-order fp32 sum; 300 calls across the
// 2^64 epoch wrap; gemm_all_reduce against GEMM + all_reduce bit for bit; a rank that never arrives
// makes the others fail with a timeout status instead of hanging. Build with -fsanitize=thread to
// check the flag ordering.
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "check.h"
#include "decodekit/comm/allreduce.h"

using namespace dk_test;
namespace comm = dk::comm;

namespace {

struct Group {
  int ws;
  int64_t buffer_bytes;
  std::vector<std::vector<char>> bufs;   // over-allocated, aligned views below
  std::vector<std::vector<char>> sigs;
  comm::Peers peers;

  Group(int ws_, int64_t buffer_bytes_, uint64_t epoch, double timeout_s = 10.0)
      : ws(ws_), buffer_bytes(buffer_bytes_) {
    peers.world_size = ws;
    peers.buffer_bytes = buffer_bytes;
    for (int q = 0; q < ws; ++q) {
      bufs.emplace_back(buffer_bytes + 256, char(0x7f));  // garbage, never zeros
      sigs.emplace_back(sizeof(comm::Signal) + 256);
    }
    for (int q = 0; q < ws; ++q) {
      peers.buf[q] = align(bufs[q].data());
      peers.sig[q] = reinterpret_cast<comm::Signal*>(align(sigs[q].data()));
      dk::cpu::init_signal(peers.sig[q], ws, uint64_t(timeout_s * 1e9), epoch);
    }
  }
  static void* align(char* p) { return p + (256 - reinterpret_cast<uintptr_t>(p) % 256) % 256; }
  comm::Peers of(int rank) const {
    comm::Peers p = peers;
    p.rank = rank;
    return p;
  }
  // fn(rank) on ws threads (ranks listed in `only`, default all); returns the statuses.
  std::vector<comm::CommStatus> run(const std::function<comm::CommStatus(int)>& fn, std::vector<int> only = {}) {
    if (only.empty())
      for (int q = 0; q < ws; ++q) only.push_back(q);
    std::vector<comm::CommStatus> st(ws);
    std::vector<std::thread> th;
    for (int r : only) th.emplace_back([&, r] { st[r] = fn(r); });
    for (auto& t : th) t.join();
    return st;
  }
};

template <class T>
void test_all_reduce(Rng& rng, const char* tname) {
  for (int ws : {1, 2, 3, 4}) {
    Group g(ws, 1 << 20, 0);
    for (int64_t n : {1, 7, 8, 9, 31, 1001, 4099, 40000}) {
      std::vector<std::vector<T>> in(ws, std::vector<T>(n));
      for (int q = 0; q < ws; ++q)
        for (auto& v : in[q]) v = from_d<T>(rng.normal() * std::pow(10.0, q - 1));
      std::vector<T> want(n);
      for (int64_t i = 0; i < n; ++i) {  // fp32 in rank order, rounded once
        float acc = dk::to_float(in[0][i]);
        for (int q = 1; q < ws; ++q) acc += dk::to_float(in[q][i]);
        want[i] = dk::from_float<T>(acc);
      }
      for (bool two : {false, true}) {
        std::vector<std::vector<T>> out(ws, std::vector<T>(n + 4, poison<T>()));
        auto st = g.run([&](int r) { return dk::cpu::all_reduce<T>(out[r].data(), in[r].data(), n, g.of(r), two); });
        for (int r = 0; r < ws; ++r) {
          CHECK(st[r].ok) << tname << "ws" << ws << "n" << n << "rank" << r << st[r].what;
          CHECK(std::memcmp(out[r].data(), want.data(), n * sizeof(T)) == 0)
              << tname << "ws" << ws << "n" << n << (two ? "two-shot" : "one-shot") << "rank" << r;
          CHECK(same_bits(out[r][n], poison<T>())) << "wrote past the end";
        }
      }
    }
  }
}

void test_epoch_wrap(Rng& rng) {
  Group g(3, 1 << 16, ~uint64_t(0) - 150);
  constexpr int kCalls = 300;
  std::vector<std::vector<std::vector<float>>> in(kCalls), out(kCalls);
  for (int c = 0; c < kCalls; ++c) {
    const int64_t n = 1 + (c * 37) % 900;
    for (int q = 0; q < 3; ++q) {
      in[c].emplace_back(n);
      for (auto& v : in[c][q]) v = float(int(rng.normal() * 100));  // integers: exact sums
      out[c].emplace_back(n, NAN);
    }
  }
  auto st = g.run([&](int r) {
    for (int c = 0; c < kCalls; ++c) {
      auto s = dk::cpu::all_reduce<float>(out[c][r].data(), in[c][r].data(), int64_t(in[c][r].size()), g.of(r),
                                          c % 3 == 1);
      if (!s.ok) return s;
    }
    return comm::CommStatus{};
  });
  for (int r = 0; r < 3; ++r) CHECK(st[r].ok) << "epoch wrap: rank" << r << st[r].what;
  int bad = 0;
  for (int c = 0; c < kCalls; ++c)
    for (int r = 0; r < 3; ++r)
      for (size_t i = 0; i < in[c][r].size(); ++i)
        bad += out[c][r][i] != in[c][0][i] + in[c][1][i] + in[c][2][i];
  CHECK(bad == 0) << bad << "wrong elements across the epoch wrap";
  CHECK(g.peers.sig[0]->h.epoch == uint64_t(kCalls - 151)) << "epoch" << g.peers.sig[0]->h.epoch;
}

void test_gemm(Rng& rng) {
  const int64_t M = 3, N = 100, K = 21, tile = 32;  // 4 tiles, the last 4 wide
  for (int ws : {2, 3}) {
    Group g(ws, 1 << 16, 5);
    std::vector<std::vector<float>> a(ws, std::vector<float>(M * K)), w(ws, std::vector<float>(N * K));
    for (int q = 0; q < ws; ++q) {
      for (auto& v : a[q]) v = float(rng.normal());
      for (auto& v : w[q]) v = float(rng.normal());
    }
    auto partial = [&](int r, float* dst, int64_t n0, int64_t nc) {  // [M, nc]
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < nc; ++j) {
          float s = 0;
          for (int64_t k = 0; k < K; ++k) s += a[r][m * K + k] * w[r][(n0 + j) * K + k];
          dst[m * nc + j] = s;
        }
    };
    std::vector<std::vector<float>> fused(ws, std::vector<float>(M * N, NAN)), parts(ws, std::vector<float>(M * N));
    auto st = g.run([&](int r) {
      return dk::cpu::gemm_all_reduce<float>(fused[r].data(), M, N, tile, g.of(r),
                                             [&](float* d, int64_t n0, int64_t nc) { partial(r, d, n0, nc); });
    });
    for (int r = 0; r < ws; ++r) partial(r, parts[r].data(), 0, N);
    std::vector<std::vector<float>> plain(ws, std::vector<float>(M * N, NAN));
    auto st2 = g.run(
        [&](int r) { return dk::cpu::all_reduce<float>(plain[r].data(), parts[r].data(), M * N, g.of(r), false); });
    for (int r = 0; r < ws; ++r) {
      CHECK(st[r].ok && st2[r].ok) << "gemm ws" << ws;
      CHECK(std::memcmp(fused[r].data(), plain[0].data(), M * N * sizeof(float)) == 0)
          << "gemm_all_reduce != GEMM + all_reduce, ws" << ws << "rank" << r;
    }
  }
}

void test_timeout() {
  Group g(3, 1 << 12, 0, 0.05);
  std::vector<float> x(10, 1.f), y(10);
  auto st = g.run([&](int r) { return dk::cpu::all_reduce<float>(y.data(), x.data(), 10, g.of(r), false); }, {0, 1});
  for (int r : {0, 1}) {
    CHECK(!st[r].ok && st[r].peer == 2 && st[r].waited_s >= 0.05) << "rank" << r << "status" << st[r].ok << st[r].peer;
  }
  Group bad(2, 1 << 12, 0);
  bad.peers.sig[1]->h.magic = 0;
  CHECK(!dk::cpu::all_reduce<float>(y.data(), x.data(), 10, bad.of(0), false).ok) << "uninitialised signal accepted";
}

}  // namespace

int main() {
  Rng rng(2024);
  test_all_reduce<float>(rng, "fp32");
  test_all_reduce<dk::bf16_t>(rng, "bf16");
  test_all_reduce<dk::half_t>(rng, "fp16");
  test_epoch_wrap(rng);
  test_gemm(rng);
  test_timeout();
  return finish("test_allreduce");
}
