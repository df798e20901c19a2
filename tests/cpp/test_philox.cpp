// include/decodekit/sampling/philox.h against the Random123 known answers and against values of
// the Python implementation (python/decodekit/sampling/philox.py, which tests/sampling checks
// against the same known answers): random counters/keys, the token-uniform layout (incl. 64-bit
// seeds and positions) and derive_seed. The two implementations must agree bit for bit: CPU and
// CUDA sampling (and speculative-decoding acceptance) draw the same numbers for the same request.
#include "check.h"
#include "decodekit/sampling/philox.h"

namespace {

struct Kat { uint32_t c[4], k[2], w[4]; };

// Random123 tests/kat_vectors ("philox4x32 10"), then 6 rows computed by philox.py.
const Kat kats[] = {
  {{0u, 0u, 0u, 0u}, {0u, 0u}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
  {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
   {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
  {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
   {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  {{0x9f767c45u, 0x4164d839u, 0xbde5c099u, 0x5bc8fbbcu}, {0xcb91ce37u, 0xb0c11fdeu}, {0x1d6d92adu, 0x263c2abbu, 0x307a7bbeu, 0x39e981dau}},
  {{0xf1446beau, 0xd76d4330u, 0xbd69fe29u, 0xa6eb8c9eu}, {0xec1d7da0u, 0x87b0b125u}, {0xcaadd362u, 0xba42f757u, 0xbd5b1320u, 0x1715c865u}},
  {{0x076ce2efu, 0xd7210dffu, 0x77330bdbu, 0xc6a53877u}, {0xf17fd374u, 0x3fc1ea36u}, {0x697e9720u, 0x87e150dcu, 0xc59fca49u, 0x55b5b4acu}},
  {{0xa6233255u, 0x0d464138u, 0xe6a16a3bu, 0x2827688du}, {0x1cfb10f6u, 0x5f2dd97fu}, {0x1b3e4949u, 0x17b487d2u, 0x39822acdu, 0x51f40caeu}},
  {{0x7814e8a2u, 0xde527100u, 0x3f1f65a8u, 0x617959ceu}, {0x8b33e968u, 0x1a1afe87u}, {0xef6c9d1eu, 0x45b6e61du, 0x9c39b65bu, 0xe474c736u}},
  {{0x92edcf45u, 0x3fd42359u, 0x035b7399u, 0xbb2edb20u}, {0x377b9aa2u, 0x687c966cu}, {0xf5810065u, 0x197fb303u, 0xe93a9127u, 0xeecdc916u}},
};

// token_uniforms(seeds = [0, 12345, 2^62 + 7], positions = [0, 17, 2^33 + 5], vocab 11) from philox.py
const uint64_t seeds[3] = {0, 12345, (uint64_t(1) << 62) + 7};
const uint64_t positions[3] = {0, 17, (uint64_t(1) << 33) + 5};
const float uni[3][11] = {
  {0.3990464210510254f, 0.8805201649665833f, 0.7357127666473389f, 0.6054818034172058f, 0.9722411632537842f, 0.362091064453125f, 0.6939308643341064f, 0.037094056606292725f, 0.01944941282272339f, 0.31944572925567627f, 0.14094656705856323f},
  {0.7601144313812256f, 0.5384566187858582f, 0.2738575339317322f, 0.13244736194610596f, 0.6653398275375366f, 0.21696025133132935f, 0.13894975185394287f, 0.0907825231552124f, 0.8679471611976624f, 0.6010664105415344f, 0.31264984607696533f},
  {0.7514470815658569f, 0.022738397121429443f, 0.6673868894577026f, 0.7713123559951782f, 0.0927269458770752f, 0.04809015989303589f, 0.1625310182571411f, 0.807344377040863f, 0.7010256052017212f, 0.9758500456809998f, 0.5973823070526123f},
};

}  // namespace

int main() {
  for (const Kat& t : kats) {
    const dk::Philox4 w = dk::philox4x32_10(dk::Philox4{{t.c[0], t.c[1], t.c[2], t.c[3]}}, t.k[0], t.k[1]);
    for (int i = 0; i < 4; ++i) CHECK(w.v[i] == t.w[i]) << "philox word " << i << " of counter " << t.c[0];
  }
  for (int b = 0; b < 3; ++b)
    for (uint32_t v = 0; v < 11; ++v)
      CHECK(dk::token_uniform(seeds[b], positions[b], v) == uni[b][v]) << "token_uniform row " << b << " token " << v;
  // the float mapping: top 24 bits, never 1.0
  CHECK(dk::philox_uniform(0u) == 0.f);
  CHECK(dk::philox_uniform(0xffffffffu) == 1.f - 5.9604644775390625e-8f);
  CHECK(dk::philox_uniform(0x000000ffu) == 0.f);
  CHECK(dk::philox_uniform(0x00000100u) == 5.9604644775390625e-8f);
  // derive_seed (philox.py: [0, 4399830976798759830, 860328410556018787, 8392298402801912866])
  CHECK(dk::derive_seed(0, 0) == 0u);
  CHECK(dk::derive_seed(12345, 1) == 4399830976798759830ull);
  CHECK(dk::derive_seed(99, 7) == 860328410556018787ull);
  CHECK(dk::derive_seed((uint64_t(1) << 62) + 3, 2) == 8392298402801912866ull);
  // streams are independent: the same (seed, position, token) in another stream differs
  int same = 0;
  for (uint32_t v = 0; v < 64; ++v) same += dk::token_uniform(5, 9, v, 0) == dk::token_uniform(5, 9, v, 1);
  CHECK(same < 4) << same << " of 64 equal across streams";
  return dk_test::finish("test_philox");
}
