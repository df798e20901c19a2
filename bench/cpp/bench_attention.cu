// CUDA build of bench_attention.cpp: the same cases, timed on the GPU (see bench_common.h).
#include "bench_attention.cpp"
