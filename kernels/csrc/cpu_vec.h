// Vector helpers shared by the CPU kernels: one register's worth of fp32 lanes, loads that
// widen bf16/fp16 to fp32, horizontal reductions and a polynomial exp. The lane count
// follows the instruction set the file is compiled for (kernels/cpu_native.py builds each
// kernel once per instruction set and picks one at run time).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace inflight_cpu {

#if defined(__AVX512F__)
constexpr int kLanes = 16;  // one zmm register
#elif defined(__AVX2__)
constexpr int kLanes = 8;  // one ymm register
#else
#error "build with -mavx2 -mfma or -mavx512f (kernels/cpu_native.py chooses the flags)"
#endif

// kLanes floats in one vector register (GCC/Clang vector extensions).
typedef float vf __attribute__((vector_size(4 * kLanes)));
typedef int32_t vi __attribute__((vector_size(4 * kLanes)));
typedef uint16_t vh __attribute__((vector_size(2 * kLanes)));
typedef uint32_t vu __attribute__((vector_size(4 * kLanes)));

inline vf splat(float x) { return vf{} + x; }

// kLanes consecutive elements as fp32 lanes: fp32 is copied, bf16 shifted into the high half
// of each lane, fp16 converted by the compiler (F16C).
template <typename scalar_t>
inline vf loadv(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    vf r;
    std::memcpy(&r, p, sizeof(r));
    return r;
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    vh h;
    std::memcpy(&h, p, sizeof(h));
    vu w = __builtin_convertvector(h, vu) << 16;
    vf r;
    std::memcpy(&r, &w, sizeof(r));
    return r;
  } else {
    vf r;
    for (int i = 0; i < kLanes; ++i) r[i] = static_cast<float>(p[i]);
    return r;
  }
}

inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// The lanes' sum and maximum by halving: log2(kLanes) shuffle-and-combine steps, so several
// reductions in flight overlap (a lane-by-lane loop would be one long dependent chain).
#if defined(__AVX512F__)
template <typename Op>
inline vf fold(vf v, Op op) {
  v = op(v, __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
  v = op(v, __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
  v = op(v, __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
  return op(v, __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
}
#else
template <typename Op>
inline vf fold(vf v, Op op) {
  v = op(v, __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3}));
  v = op(v, __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5}));
  return op(v, __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6}));
}
#endif

inline float hsum(vf v) {
  return fold(v, [](vf a, vf b) { return a + b; })[0];
}

inline float hmax(vf v) {
  return fold(v, [](vf a, vf b) { return a > b ? a : b; })[0];
}

// e^x per lane (about 1 ulp): -inf and anything below -87.3 give exactly 0, anything above
// 88.7 gives +inf. Range reduction x = n ln2 + r, |r| <= ln2 / 2, then Cephes' degree-6
// expf polynomial for e^r and 2^n put into the exponent bits.
inline vf vexp(vf x) {
  const vf lo = splat(-87.3f), hi = splat(88.7f);
  const vi dead = x < lo;  // -1 where the result underflows (and for -inf)
  const vi huge = x > hi;  // -1 where it overflows (and for +inf)
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf fx = x * splat(1.44269504088896341f) + splat(0.5f);
  vi n = __builtin_convertvector(fx, vi);  // truncates toward zero
  n += __builtin_convertvector(n, vf) > fx;  // floor: -1 where truncation rounded up
  const vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * splat(0.693359375f);
  r = r - nf * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * (r * r) + r + splat(1.f);
  // 2^n in two halves so that n = 128 (x near 88.7) does not overflow the exponent field
  const vi half = n >> 1;
  const vi bits_a = (half + 127) << 23;
  const vi bits_b = (n - half + 127) << 23;
  vf scale_a, scale_b;
  std::memcpy(&scale_a, &bits_a, sizeof(scale_a));
  std::memcpy(&scale_b, &bits_b, sizeof(scale_b));
  vf out = p * scale_a * scale_b;
  out = huge ? splat(__builtin_inff()) : out;
  return dead ? splat(0.f) : out;
}

}  // namespace inflight_cpu
