// CUDA build of bench_quant.cpp: the same cases, timed on the GPU (see bench_common.h).
#include "bench_quant.cpp"
