// A decode step's whole layer stack in one native call, fp32 on the CPU.
//
// At a decode step's few rows a layer is ten small kernel calls (two norms, four linears,
// rope, the KV write, attention, silu-and-multiply), and from Python each costs a module
// call, argument checks and views besides the kernel: about 1.2 ms per step of SmolLM2's
// 30 layers on a Zen 4, next to 10-17 ms of weights to read (docs/benchmarks.md). Here the
// same kernels run in the same order on the same values, called from C++ with no Python
// between them, so the result is the one of the Python path bit for bit (the tests compare
// them) and only the calls' cost goes.
//
// The kernels are those of linear_cpu.cpp, paged_attention_cpu.cpp and fused_cpu.cpp,
// included here (with INFLIGHT_NO_MODULE, so their Python modules are not made twice) and
// compiled as their own builds compile them: the element-wise ops of fused_cpu.cpp without
// multiply-add contraction (the pragma below; their module gets -ffp-contract=off).
//
// The stack covers the layers of the "pre" layout with a dense SwiGLU MLP: full rotary
// embedding from one table or none (SmolLM3's NoPE layers), an optional per-head q/k norm
// (Qwen3), biases, sliding windows, an attention soft-cap and a residual scale (Granite):
// worker/engine/models/native_stack.py decides which models and steps take it.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#define INFLIGHT_NO_MODULE
#include "linear_cpu.cpp"
#include "paged_attention_cpu.cpp"
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#include "fused_cpu.cpp"
#pragma GCC pop_options

#include <vector>

namespace {

// One packed linear: the panels [P, K, W] of kernels/cpu_linear.py (fp32 or bf16), its
// output width and its bias (undefined: none).
struct Linear {
  torch::Tensor panels;
  int64_t out_features;
  c10::optional<torch::Tensor> bias;

  torch::Tensor operator()(const torch::Tensor& x) const { return linear(x, panels, out_features, bias); }
};

// What one layer reads: its two norms' weights, its four linears, its per-head q and k
// norm weights ([head_dim]; undefined: none), its KV cache, its sliding window (0: none) and
// whether it rotates q and k.
struct Layer {
  torch::Tensor input_norm, post_attention_norm;
  Linear qkv, o, gate_up, down;
  torch::Tensor q_norm, k_norm;
  torch::Tensor k_cache, v_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  int64_t window;
  bool rope;
};

// RMSNorm of each head's head_dim values of the `width` columns from `start` of qkv [T, ...],
// in place: the rows are copied out (they are strided), normed and copied back, as the
// Python decoder's Attention._norm_qk_ does.
void norm_heads_(torch::Tensor& qkv, int64_t start, int64_t width, const torch::Tensor& weight,
                 double eps, const torch::Tensor& none) {
  auto part = qkv.narrow(1, start, width);  // [T, width], strided rows
  const auto rows = part.reshape({-1, weight.size(0)});  // [T * heads, D], a copy
  part.copy_(add_rms_norm(rows, none, weight, eps).view({qkv.size(0), width}));
}

Linear make_linear(const torch::Tensor& panels, int64_t out_features, const torch::Tensor& bias) {
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panel_dtype(panels),
              "decoder stack: packed weights must be contiguous float32 or bfloat16 [P, K, W]");
  return {panels, out_features, bias.defined() && bias.numel() > 0 ? c10::optional<torch::Tensor>(bias)
                                                                   : c10::nullopt};
}

}  // namespace

// The layers of one model over one KV pool, made once (the tensors are shared, not copied);
// run() is one decode step through all of them.
class DecoderStack {
 public:
  // Per layer, in order: input norm, post-attention norm, q norm, k norm (an empty tensor:
  // none), then (panels, out_features, bias) of qkv, o, gate_up and down (an empty bias:
  // none), the K and V cache, the window and whether the layer has rope.
  DecoderStack(const std::vector<torch::Tensor>& norms, const std::vector<torch::Tensor>& panels,
               const std::vector<int64_t>& out_features, const std::vector<torch::Tensor>& biases,
               const std::vector<torch::Tensor>& caches, const std::vector<int64_t>& windows,
               const std::vector<bool>& ropes, int64_t num_heads, int64_t num_kv_heads,
               int64_t head_dim, double eps, double scale, double softcap, double residual_scale)
      : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps),
        scale_(scale), softcap_(softcap), residual_scale_(residual_scale) {
    const size_t n = windows.size();
    TORCH_CHECK(norms.size() == 4 * n && panels.size() == 4 * n && out_features.size() == 4 * n &&
                    biases.size() == 4 * n && caches.size() == 2 * n && ropes.size() == n,
                "decoder stack: per layer 4 norms, 4 linears, 2 caches, a window and a rope flag");
    TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim % 2 == 0,
                "decoder stack: bad head counts");
    for (size_t l = 0; l < n; ++l) {
      auto lin = [&](size_t j) { return make_linear(panels[4 * l + j], out_features[4 * l + j], biases[4 * l + j]); };
      auto head_norm = [&](size_t j) {
        const torch::Tensor& w = norms[4 * l + j];
        TORCH_CHECK(w.numel() == 0 || w.numel() == head_dim, "decoder stack: q/k norms are per head");
        return w.numel() ? w.contiguous() : torch::Tensor();
      };
      layers_.push_back({norms[4 * l].contiguous(), norms[4 * l + 1].contiguous(), lin(0), lin(1), lin(2),
                         lin(3), head_norm(2), head_norm(3), caches[2 * l], caches[2 * l + 1], windows[l],
                         static_cast<bool>(ropes[l])});
    }
  }

  // Layers [begin, end) of a decode step. hidden [T, H]: the residual stream, updated in
  // place (T decode rows, one per sequence); delta [T, H]: the MLP output of layer begin - 1,
  // not yet added to hidden (an empty tensor when begin is 0). cos/sin [T, D] of each row's
  // position; slot_mapping [T]; block_tables [T, max_blocks]; context_lens [T] (the query
  // token included). Returns layer end - 1's MLP output [T, H], not yet added (the next
  // call, or the final norm, adds it). A step run as one call or as several is the same,
  // bit for bit.
  torch::Tensor run(torch::Tensor hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                    const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                    const torch::Tensor& context_lens, const torch::Tensor& delta_in, int64_t begin,
                    int64_t end) const {
    TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous() && hidden.scalar_type() == torch::kFloat32,
                "decoder stack: hidden must be contiguous float32 [T, H]");
    const auto num_layers = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(0 <= begin && begin < end && end <= num_layers, "decoder stack: layers [", begin, ", ",
                end, ") are not a range of the ", num_layers, " layers");
    TORCH_CHECK((delta_in.numel() == 0) == (begin == 0),
                "decoder stack: the previous layer's output is given exactly when begin > 0");
    TORCH_CHECK(delta_in.numel() == 0 || delta_in.sizes() == hidden.sizes(),
                "decoder stack: the previous layer's output must be shaped like hidden");
    const int64_t tokens = hidden.size(0);
    const int64_t q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
    const auto cu_q = torch::arange(tokens + 1, torch::kInt64);  // [T + 1]: one query per sequence
    const auto cos_c = cos.contiguous(), sin_c = sin.contiguous();
    const auto slots = slot_mapping.to(torch::kInt64).contiguous();
    const auto tables = block_tables.to(torch::kInt64).contiguous();
    const auto lens = context_lens.to(torch::kInt64).contiguous();
    const auto none = torch::empty({0}, hidden.options());
    torch::Tensor delta = begin == 0 ? none : delta_in.contiguous();  // the last block's output, not yet added
    for (int64_t l = begin; l < end; ++l) {
      const Layer& layer = layers_[l];
      const auto x = add_rms_norm(hidden, delta, layer.input_norm, eps_);  // hidden += delta
      auto qkv = layer.qkv(x);  // [T, q_size + 2 kv_size]
      if (layer.q_norm.defined()) {
        norm_heads_(qkv, 0, q_size, layer.q_norm, eps_, none);
        norm_heads_(qkv, q_size, kv_size, layer.k_norm, eps_, none);
      }
      if (layer.rope) rope_qk_(qkv, cos_c, sin_c, num_heads_, num_kv_heads_);
      const auto q = qkv.narrow(1, 0, q_size).view({tokens, num_heads_, head_dim_});  // strided rows
      const auto k = qkv.narrow(1, q_size, kv_size).view({tokens, num_kv_heads_, head_dim_});
      const auto v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads_, head_dim_});
      write_kv(k, v, layer.k_cache, layer.v_cache, slots);
      const auto attn = paged_attention(q, layer.k_cache, layer.v_cache, tables, cu_q, lens, scale_,
                                        layer.window, softcap_);  // [T, Hq, D]
      auto out = layer.o(attn.view({tokens, q_size}));  // [T, H]
      if (residual_scale_ != 1.0) out.mul_(residual_scale_);
      const auto y = add_rms_norm(hidden, out, layer.post_attention_norm, eps_);  // hidden += out
      delta = layer.down(silu_mul(layer.gate_up(y)));  // [T, H]
      if (residual_scale_ != 1.0) delta.mul_(residual_scale_);
    }
    return delta;
  }

 private:
  std::vector<Layer> layers_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_, softcap_, residual_scale_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: builds with other flags (another name) may be loaded in one process
  py::class_<DecoderStack>(m, "DecoderStack", py::module_local())
      .def(py::init<const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                    const std::vector<int64_t>&, const std::vector<torch::Tensor>&,
                    const std::vector<torch::Tensor>&, const std::vector<int64_t>&,
                    const std::vector<bool>&, int64_t, int64_t, int64_t, double, double, double,
                    double>())
      .def("run", &DecoderStack::run,
           "layers [begin, end) of one decode step; returns the last one's MLP output, not yet added",
           py::call_guard<py::gil_scoped_release>());
  m.def("panel_width", &panel_width, "output columns per packed panel (must match kernels/cpu_linear.py)");
}
