// The INT4 layout's shared per-element logic (include/decodekit/gemm/int4_common.h):
//  - int4_interleaved_source: reading a row's bytes as plain packed 4-bit elements (the CUTLASS sm90
//    mixed-input GEMM's cutlass::uint4b_t view: element j = low nibble of byte j / 2 when j is even,
//    high nibble when odd), logical element gG + j is our element gG + int4_interleaved_source(j, G)
//    (int4_code), for every group size, every byte value and every position; and it is a permutation
//    of each group (so interleaving the activations keeps every dot product);
//  - int4_code's group-split order itself (element i low nibble, i + G/2 high nibble of byte i).
#include <vector>

#include "check.h"
#include "decodekit/gemm/int4_common.h"

using namespace dk_test;

int main() {
  Rng rng(11);
  for (int G : {32, 64, 128}) {
    const int64_t K = 4 * G;
    std::vector<uint8_t> row(size_t(K / 2));
    for (int trial = 0; trial < 64; ++trial) {
      for (auto& b : row) b = uint8_t(rng.u32());
      if (trial == 0)
        for (size_t i = 0; i < row.size(); ++i) row[i] = uint8_t(i * 37 + 11);  // every byte value over the trials
      for (int64_t k = 0; k < K; ++k) {
        const int plain = (k & 1) ? row[size_t(k / 2)] >> 4 : row[size_t(k / 2)] & 15;
        const int64_t g = k / G;
        const int j = int(k - g * G);
        const int src = dk::int4_interleaved_source(j, G);
        CHECK(src >= 0 && src < G) << "G" << G << "j" << j << "src" << src;
        CHECK(dk::int4_code(row.data(), G, g * G + src) == plain) << "G" << G << "k" << k;
      }
    }
    std::vector<int> seen(size_t(G), 0);
    for (int j = 0; j < G; ++j) ++seen[size_t(dk::int4_interleaved_source(j, G))];
    for (int i = 0; i < G; ++i) CHECK(seen[size_t(i)] == 1) << "G" << G << "element" << i << "hit" << seen[size_t(i)];
    // group-split order: byte i of a group holds elements i (low) and i + G/2 (high)
    std::vector<uint8_t> one(size_t(G / 2), 0);
    one[3] = 0xA5;
    CHECK(dk::int4_code(one.data(), G, 3) == 5 && dk::int4_code(one.data(), G, G / 2 + 3) == 10) << "G" << G;
  }
  return finish("test_int4_common");
}
