// CUDA build of bench_activation.cpp: the same cases, timed on the GPU (see bench_common.h).
#include "bench_activation.cpp"
