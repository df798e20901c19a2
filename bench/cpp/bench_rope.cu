// CUDA build of bench_rope.cpp: the same cases, timed on the GPU (see bench_common.h).
#include "bench_rope.cpp"
