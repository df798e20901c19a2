// Type helpers shared by the emulator tests: the CPU kernels' storage type for each CUDA one,
// a dtype name, and an element as fp32.
#pragma once
#include <type_traits>

#include "decodekit/common/dtype.h"

template <class T> struct Cpu;
template <> struct Cpu<float> { using type = float; };
template <> struct Cpu<__half> { using type = dk::half_t; };
template <> struct Cpu<__nv_bfloat16> { using type = dk::bf16_t; };
template <class T> const char* tname() { return sizeof(T) == 4 ? "fp32" : std::is_same_v<T, __half> ? "fp16" : "bf16"; }
template <class T> float ld(const T& x) { return dk::Conv<T>::load(x); }
