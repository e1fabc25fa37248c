// Vector helpers shared by the CPU kernels: one register's worth of fp32 lanes, loads that
// widen bf16/fp16 to fp32, horizontal reductions, a polynomial exp and a tanh built on it.
// The lane count follows the instruction set the file is compiled for (kernels/cpu_native.py
// builds each kernel once per instruction set and picks one at run time).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

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

// Whether any lane of a comparison's result (-1 where true, 0 where false) is set.
inline bool any_lane(vi mask) {
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask) != 0;
#else
  return _mm256_movemask_ps((__m256)mask) != 0;
#endif
}

// Eight sums in one 8-float vector: lane i = the sum of p[i]'s eight lanes. Two rounds of
// pairwise adds within 128-bit halves, then one swap of halves: about 2.6 instructions per
// vector against 6 for a separate hsum of each.
typedef float v8 __attribute__((vector_size(32)));
inline v8 transpose_sum8(const v8* p) {
  const __m256 s01 = _mm256_hadd_ps(p[0], p[1]);  // [p0 01, p0 23, p1 01, p1 23 | p0 45, p0 67, p1 45, p1 67]
  const __m256 s23 = _mm256_hadd_ps(p[2], p[3]);
  const __m256 s45 = _mm256_hadd_ps(p[4], p[5]);
  const __m256 s67 = _mm256_hadd_ps(p[6], p[7]);
  const __m256 s03 = _mm256_hadd_ps(s01, s23);  // [p0..p3 sums of lanes 0-3 | of lanes 4-7]
  const __m256 s47 = _mm256_hadd_ps(s45, s67);
  const __m256 low = _mm256_permute2f128_ps(s03, s47, 0x20);   // lanes 0-3 of p0..p7
  const __m256 high = _mm256_permute2f128_ps(s03, s47, 0x31);  // lanes 4-7 of p0..p7
  return low + high;
}

// kLanes sums in one vector: lane i = the sum of p[i]'s lanes (p holds kLanes vectors).
// With AVX-512 each vector's halves are added first, then two groups of eight go through
// transpose_sum8.
inline vf transpose_sum(const vf* p) {
#if defined(__AVX512F__)
  v8 halves[16];
  for (int i = 0; i < 16; ++i) {
    v8 low, high;
    std::memcpy(&low, &p[i], sizeof(low));
    std::memcpy(&high, reinterpret_cast<const char*>(&p[i]) + sizeof(low), sizeof(high));
    halves[i] = low + high;
  }
  const v8 first = transpose_sum8(halves), second = transpose_sum8(halves + 8);
  vf r;
  std::memcpy(&r, &first, sizeof(first));
  std::memcpy(reinterpret_cast<char*>(&r) + sizeof(first), &second, sizeof(second));
  return r;
#else
  return transpose_sum8(p);
#endif
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

// tanh per lane, to about 2 ulp (Cephes' tanhf): below |x| = 0.625 an odd degree-11
// polynomial (no cancellation near 0, so small arguments keep their relative accuracy),
// above it 1 - 2 / (e^(2|x|) + 1) with the sign put back; |x| past about 44 gives exactly
// +-1 (e^(2|x|) is +inf). Used for attention-logit soft-capping.
inline vf vtanh(vf x) {
  const vf ax = x < splat(0.f) ? -x : x;
  const vf z = x * x;
  vf p = splat(-5.70498872745e-3f);
  p = p * z + splat(2.06390887954e-2f);
  p = p * z + splat(-5.37397155531e-2f);
  p = p * z + splat(1.33314422036e-1f);
  p = p * z + splat(-3.33332819422e-1f);
  const vf small = p * z * x + x;
  vf large = splat(1.f) - splat(2.f) / (vexp(ax + ax) + splat(1.f));
  large = x < splat(0.f) ? -large : large;
  return ax < splat(0.625f) ? small : large;
}

}  // namespace inflight_cpu
