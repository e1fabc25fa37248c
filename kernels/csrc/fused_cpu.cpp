// Fused element-wise ops of a Llama-family layer on the CPU, fp32: each replaces five to
// twelve separate torch ops (and their temporaries) by one pass over the rows. At a decode
// step's row counts the separate ops cost more in dispatch than in arithmetic.
//
//   add_rms_norm(hidden [T, H], delta [T, H] or empty, weight [H], eps) -> [T, H]
//       hidden += delta in place (the residual), then weight * (hidden * rsqrt(mean(hidden^2)
//       + eps)), rounded as transformers' LlamaRMSNorm rounds it.
//   rope_qk_(qkv [T, (Hq + 2 Hkv) * D], cos [T, D], sin [T, D], Hq, Hkv)
//       rotates the q and k parts of each row in place (rotate_half convention):
//       out[d] = x[d] cos[d] - x[d + D/2] sin[d] for d < D/2, x[d] cos[d] + x[d - D/2] sin[d]
//       after; v is left alone.
//   silu_mul(gate_up [T, 2 I]) -> [T, I]: silu(gate) * up, silu(x) = x / (1 + e^-x).
//   max_per_row(x [R, V]) -> (values [R], indices [R] int64): torch.max(x, dim=-1) (the first
//       index of the maximum; a row with a NaN gives NaN and its first NaN's index), rows in
//       parallel where torch's argmax of a logits batch runs on one thread.
//
// Built with -ffp-contract=off (kernels/cpu_native.py), so no multiply-add is fused and every
// product and sum is rounded as torch's separate ops round it; only the order of the squares'
// sum in the norm and the exp in silu (a polynomial of about 1 ulp) differ from torch.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "cpu_vec.h"

namespace {

using namespace inflight_cpu;

constexpr int64_t kRowGrain = 4;  // rows per parallel task: a row is only ~H floats

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name,
              ": float32 CPU tensors only");
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, ": expected [rows, features] with unit stride");
}

}  // namespace

torch::Tensor add_rms_norm(torch::Tensor hidden, torch::Tensor delta, torch::Tensor weight,
                           double eps) {
  check_rows(hidden, "add_rms_norm");
  const bool add = delta.numel() > 0;
  if (add) {
    check_rows(delta, "add_rms_norm delta");
    TORCH_CHECK(delta.sizes() == hidden.sizes(), "add_rms_norm: delta and hidden differ in shape");
  }
  weight = weight.contiguous();
  const int64_t rows = hidden.size(0), h = hidden.size(1);
  TORCH_CHECK(weight.numel() == h, "add_rms_norm: weight must have one entry per feature");
  auto out = torch::empty({rows, h}, hidden.options());
  float* hp = hidden.data_ptr<float>();
  const float* dp = add ? delta.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t hs = hidden.stride(0), ds = add ? delta.stride(0) : 0;
  const float epsf = static_cast<float>(eps);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* x = hp + r * hs;
      vf acc = {};
      int64_t i = 0;
      for (; i + kLanes <= h; i += kLanes) {
        vf v = loadv(x + i);
        if (add) {
          v = v + loadv(dp + r * ds + i);
          storev(x + i, v);
        }
        acc += v * v;
      }
      float tail = 0.f;
      for (; i < h; ++i) {
        if (add) x[i] = x[i] + dp[r * ds + i];
        tail += x[i] * x[i];
      }
      const float mean = (hsum(acc) + tail) / static_cast<float>(h);
      const float inv = 1.f / std::sqrt(mean + epsf);
      float* y = op + r * h;
      for (int64_t j = 0; j < h; ++j) y[j] = wp[j] * (x[j] * inv);
    }
  });
  return out;
}

void rope_qk_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
              int64_t num_kv_heads) {
  check_rows(qkv, "rope_qk_");
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t rows = qkv.size(0), d = cos.size(1), half = d / 2;
  TORCH_CHECK(cos.size(0) == rows && sin.sizes() == cos.sizes(), "rope_qk_: cos/sin must be [rows, head_dim]");
  TORCH_CHECK(d % 2 == 0 && qkv.size(1) == (num_heads + 2 * num_kv_heads) * d,
              "rope_qk_: qkv must be [rows, (heads + 2 kv_heads) * head_dim]");
  float* base = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t stride = qkv.stride(0), rotated_heads = num_heads + num_kv_heads;
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> first(half);
    for (int64_t r = begin; r < end; ++r) {
      const float* c = cp + r * d;
      const float* s = sp + r * d;
      for (int64_t head = 0; head < rotated_heads; ++head) {
        float* x = base + r * stride + head * d;
        for (int64_t j = 0; j < half; ++j) first[j] = x[j];
        for (int64_t j = 0; j < half; ++j) x[j] = x[j] * c[j] + (-x[j + half]) * s[j];
        for (int64_t j = half; j < d; ++j) x[j] = x[j] * c[j] + first[j - half] * s[j];
      }
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "silu_mul");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * inter, "silu_mul: expected an even number of features");
  auto out = torch::empty({rows, inter}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t gs = gate_up.stride(0);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gp + r * gs;
      const float* u = g + inter;
      float* y = op + r * inter;
      int64_t i = 0;
      for (; i + kLanes <= inter; i += kLanes) {
        const vf x = loadv(g + i);
        const vf silu = x / (splat(1.f) + vexp(-x));
        storev(y + i, silu * loadv(u + i));
      }
      for (; i < inter; ++i) y[i] = (g[i] / (1.f + std::exp(-g[i]))) * u[i];
    }
  });
  return out;
}

// The maximum of one row and the index of its first occurrence (NaN beats everything).
std::pair<float, int64_t> row_max(const float* x, int64_t n) {
  vf m = splat(-std::numeric_limits<float>::infinity());
  vi nan = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {  // the largest non-NaN value, and whether any is NaN
    const vf v = loadv(x + i);
    m = v > m ? v : m;
    nan |= v != v;
  }
  float best = hmax(m);
  bool any_nan = any_lane(nan);
  for (; i < n; ++i) {
    any_nan = any_nan || std::isnan(x[i]);
    best = x[i] > best ? x[i] : best;
  }
  int64_t j = 0;  // the first index holding it: a whole vector at a time, then its lanes
  for (; j + kLanes <= n; j += kLanes) {
    const vf v = loadv(x + j);
    if (any_lane(any_nan ? v != v : v == splat(best))) break;
  }
  for (; j < n; ++j) {
    if (any_nan ? std::isnan(x[j]) : x[j] == best) return {x[j], j};
  }
  return {best, 0};  // n == 0 is refused by the caller
}

std::tuple<torch::Tensor, torch::Tensor> max_per_row(torch::Tensor x) {
  check_rows(x, "max_per_row");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(n > 0, "max_per_row: rows must not be empty");
  auto values = torch::empty({rows}, x.options());
  auto indices = torch::empty({rows}, x.options().dtype(torch::kInt64));
  const float* xp = x.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  int64_t* ip = indices.data_ptr<int64_t>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) std::tie(vp[r], ip[r]) = row_max(xp + r * xs, n);
  });
  return {values, indices};
}

// decoder_cpu.cpp includes this file for its kernels and makes a module of its own.
#ifndef INFLIGHT_NO_MODULE
// Run without the GIL, as the attention kernel's entry points (paged_attention_cpu.cpp).
using NoGil = py::call_guard<py::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "residual add (in place) and RMSNorm, fp32 rows", NoGil());
  m.def("rope_qk_", &rope_qk_, "rotary embedding of the q and k parts of qkv rows, in place",
        NoGil());
  m.def("silu_mul", &silu_mul, "silu(gate) * up of [rows, 2 I] gate_up rows", NoGil());
  m.def("max_per_row", &max_per_row, "torch.max(x, dim=-1) of fp32 rows, rows in parallel",
        NoGil());
}
#endif  // INFLIGHT_NO_MODULE
