// CUDA build of bench_norm.cpp: the same cases, timed on the GPU (see bench_common.h).
#include "bench_norm.cpp"
