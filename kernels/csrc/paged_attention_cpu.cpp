// Paged attention on the CPU: ragged query chunks (q_len >= 1 per sequence) attending to
// their context through the block table, reading K/V blocks in place (no gather copy).
//
// Layouts (the same as kernels/reference.py):
//   query        [num_tokens, num_heads, head_dim]        packed, sequence i owns rows
//                                                          cu_seqlens_q[i]:cu_seqlens_q[i+1]
//   k/v cache    [num_blocks, block_size, num_kv_heads, head_dim]
//   block_tables [num_seqs, max_blocks] int64
//   context_lens [num_seqs] int64: cached prefix + this chunk; the queries are the chunk's
//                last q_len tokens, query j (0-based in the chunk) sees keys
//                0 .. context_len - q_len + j (causal within the chunk, full over the prefix)
//   out          [num_tokens, num_heads, head_dim]
//
// One work item is (sequence, KV head, tile of up to kQueryTile query tokens): the tile's
// query vectors (tokens x the KV head's query group) share every K/V row they read, so a
// key row is loaded once per tile. Softmax is online (running max and denominator per
// query vector), accumulated in fp32 whatever the cache dtype. Work items run on torch's
// intra-op thread pool (at::parallel_for), so torch.set_num_threads governs them.
//
// The same source is compiled once per instruction set (kernels/cpu_native.py picks the
// build from the CPU's flags at run time): with AVX-512 a vector holds 16 floats, with AVX2
// 8. Scores, the softmax's exponentials and the value accumulation all run on those
// vectors; exp is a Cephes-style polynomial (about 1 ulp), since a scalar std::exp per
// score cost more than the dot products. A bf16 or fp16 cache is widened to fp32 lanes as
// it is loaded, so reduced-precision caches take the same vector path.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_vec.h"

namespace {

using namespace inflight_cpu;

constexpr int64_t kQueryTile = 8;

struct WorkItem {
  int64_t seq;
  int64_t kv_head;
  int64_t tile_start;  // first query token of the tile, 0-based within the sequence's chunk
  int64_t tile_end;    // one past the last
};

// scores[v] = q[v] . k_row for vectors [0, nvec): the key row stays in registers and four
// query vectors are dotted at once, so four independent FMA chains are in flight.
template <typename scalar_t, int D>
inline void dot_rows(const float* q, const scalar_t* k_row, int64_t nvec, float* scores,
                     int64_t score_stride) {
  constexpr int C = D / kLanes;
  vf kr[C];
  for (int c = 0; c < C; ++c) kr[c] = loadv(k_row + kLanes * c);
  int64_t v = 0;
  for (; v + 4 <= nvec; v += 4) {
    vf a0 = {}, a1 = {}, a2 = {}, a3 = {};
    const float* q0 = q + v * D;
    for (int c = 0; c < C; ++c) {
      a0 += loadv(q0 + kLanes * c) * kr[c];
      a1 += loadv(q0 + D + kLanes * c) * kr[c];
      a2 += loadv(q0 + 2 * D + kLanes * c) * kr[c];
      a3 += loadv(q0 + 3 * D + kLanes * c) * kr[c];
    }
    scores[v * score_stride] = hsum(a0);
    scores[(v + 1) * score_stride] = hsum(a1);
    scores[(v + 2) * score_stride] = hsum(a2);
    scores[(v + 3) * score_stride] = hsum(a3);
  }
  for (; v < nvec; ++v) {
    vf a = {};
    for (int c = 0; c < C; ++c) a += loadv(q + v * D + kLanes * c) * kr[c];
    scores[v * score_stride] = hsum(a);
  }
}

// acc[v] += p[v] * v_row for every vector with a non-zero weight; v_row stays in registers.
template <typename scalar_t, int D>
inline void accumulate_rows(const float* p, int64_t p_stride, const scalar_t* v_row,
                            int64_t nvec, float* acc) {
  constexpr int C = D / kLanes;
  vf vr[C];
  for (int c = 0; c < C; ++c) vr[c] = loadv(v_row + kLanes * c);
  for (int64_t v = 0; v < nvec; ++v) {
    const float w = p[v * p_stride];
    if (w == 0.f) continue;
    float* a = acc + v * D;
    const vf wv = splat(w);
    for (int c = 0; c < C; ++c) storev(a + kLanes * c, loadv(a + kLanes * c) + wv * vr[c]);
  }
}

template <typename scalar_t>
inline float dot(const float* q, const scalar_t* k, int64_t head_dim) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < head_dim; ++d) acc += q[d] * static_cast<float>(k[d]);
  return acc;
}

template <typename scalar_t>
inline void axpy(float w, const scalar_t* v, float* acc, int64_t head_dim) {
#pragma omp simd
  for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * static_cast<float>(v[d]);
}

// Softmax of one block's scores for one query vector, folded into the running state:
// s[0, padded) holds the scores (-inf where the key is invisible or past the block's end);
// on return it holds the unnormalised weights e^(s - new_max), and acc, run_max and run_sum
// are rescaled and updated. Returns false when nothing in the block was visible.
inline bool softmax_block(float* s, int64_t padded, float* acc, int64_t head_dim,
                          float& run_max, float& run_sum) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  vf m = splat(kNegInf);
  for (int64_t j = 0; j < padded; j += kLanes) {
    const vf x = loadv(s + j);
    m = x > m ? x : m;
  }
  const float block_max = hmax(m);
  if (block_max == kNegInf) {
    std::fill(s, s + padded, 0.f);
    return false;
  }
  const float new_max = std::max(run_max, block_max);
  const float correction = std::exp(run_max - new_max);  // exp(-inf) = 0 at the start
  if (correction != 1.f) {
    for (int64_t d = 0; d < head_dim; ++d) acc[d] *= correction;
  }
  vf sum = {};
  for (int64_t j = 0; j < padded; j += kLanes) {
    const vf e = vexp(loadv(s + j) - splat(new_max));  // -inf - max = -inf -> 0
    storev(s + j, e);
    sum += e;
  }
  run_sum = run_sum * correction + hsum(sum);
  run_max = new_max;
  return true;
}

// Ask for a block's rows of one head ([block_size] rows of head_dim, row_stride apart)
// ahead of use: blocks sit anywhere in the pool, so the hardware cannot guess the next one.
template <typename scalar_t>
inline void prefetch_head_rows(const scalar_t* first_row, int64_t rows, int64_t row_stride,
                               int64_t head_dim) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));  // elements per cache line
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* row = first_row + r * row_stride;
    for (int64_t d = 0; d < head_dim; d += kLine) __builtin_prefetch(row + d, 0, 3);
  }
}

// D > 0: a head_dim of D, register-blocked with the cache widened to fp32 lanes as it is
// read; D == 0: any head_dim, scalar dot products and value sums.
template <typename scalar_t, int D>
void run_item(const WorkItem& item, const scalar_t* query, const scalar_t* k_cache,
              const scalar_t* v_cache, const int64_t* block_tables, const int64_t* cu_q,
              const int64_t* context_lens, scalar_t* out, int64_t max_blocks,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
              float scale) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t group = num_heads / num_kv_heads;
  const int64_t q_start = cu_q[item.seq];
  const int64_t q_len = cu_q[item.seq + 1] - q_start;
  const int64_t ctx = context_lens[item.seq];
  const int64_t first_pos = ctx - q_len;  // absolute position of the chunk's first query
  const int64_t tile_tokens = item.tile_end - item.tile_start;
  const int64_t nvec = tile_tokens * group;  // query vectors in this tile
  const int64_t* table = block_tables + item.seq * max_blocks;
  const int64_t row_stride = num_kv_heads * head_dim;  // between consecutive slots
  // A score row per query vector, padded to whole vectors: [nvec, padded]
  const int64_t padded = (block_size + kLanes - 1) / kLanes * kLanes;

  // q_tile[v][d]: query vector v = token t * group + g, pre-scaled.
  std::vector<float> q_tile(nvec * head_dim);
  std::vector<float> acc(nvec * head_dim, 0.f);
  std::vector<float> run_max(nvec, kNegInf);
  std::vector<float> run_sum(nvec, 0.f);
  std::vector<int64_t> last_key(nvec);  // highest key position the vector may see
  std::vector<float> scores(nvec * padded);
  for (int64_t t = 0; t < tile_tokens; ++t) {
    const int64_t token = q_start + item.tile_start + t;
    for (int64_t g = 0; g < group; ++g) {
      const int64_t v = t * group + g;
      const scalar_t* src = query + (token * num_heads + item.kv_head * group + g) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) q_tile[v * head_dim + d] = static_cast<float>(src[d]) * scale;
      last_key[v] = first_pos + item.tile_start + t;
    }
  }
  const int64_t tile_last_key = first_pos + item.tile_end - 1;
  const int64_t num_blocks = tile_last_key / block_size + 1;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t block = table[b];
    const int64_t base_pos = b * block_size;
    const int64_t n_keys = std::min(block_size, tile_last_key + 1 - base_pos);
    const scalar_t* k_block = k_cache + block * block_size * row_stride + item.kv_head * head_dim;
    const scalar_t* v_block = v_cache + block * block_size * row_stride + item.kv_head * head_dim;
    if (b + 1 < num_blocks) {  // start loading the next block's rows of this head
      prefetch_head_rows(k_cache + table[b + 1] * block_size * row_stride + item.kv_head * head_dim,
                         block_size, row_stride, head_dim);
      prefetch_head_rows(v_cache + table[b + 1] * block_size * row_stride + item.kv_head * head_dim,
                         block_size, row_stride, head_dim);
    }
    // scores[v][j] for the block's visible keys; invisible and missing keys get -inf.
    for (int64_t j = 0; j < n_keys; ++j) {
      const scalar_t* k_row = k_block + j * row_stride;
      if constexpr (D > 0) {
        dot_rows<scalar_t, D>(q_tile.data(), k_row, nvec, scores.data() + j, padded);
      } else {
        for (int64_t v = 0; v < nvec; ++v) {
          scores[v * padded + j] = dot(q_tile.data() + v * head_dim, k_row, head_dim);
        }
      }
    }
    for (int64_t v = 0; v < nvec; ++v) {  // causal: a query sees no key after itself
      const int64_t visible = std::max<int64_t>(0, std::min(n_keys, last_key[v] - base_pos + 1));
      std::fill(scores.data() + v * padded + visible, scores.data() + (v + 1) * padded, kNegInf);
      softmax_block(scores.data() + v * padded, padded, acc.data() + v * head_dim, head_dim,
                    run_max[v], run_sum[v]);
    }
    // acc[v] += sum_j p[v][j] * V[j]: each value row is loaded once for all vectors.
    for (int64_t j = 0; j < n_keys; ++j) {
      const scalar_t* v_row = v_block + j * row_stride;
      if constexpr (D > 0) {
        accumulate_rows<scalar_t, D>(scores.data() + j, padded, v_row, nvec, acc.data());
      } else {
        for (int64_t v = 0; v < nvec; ++v) {
          const float p = scores[v * padded + j];
          if (p != 0.f) axpy(p, v_row, acc.data() + v * head_dim, head_dim);
        }
      }
    }
  }
  for (int64_t t = 0; t < tile_tokens; ++t) {
    const int64_t token = q_start + item.tile_start + t;
    for (int64_t g = 0; g < group; ++g) {
      const int64_t v = t * group + g;
      const float inv = 1.f / run_sum[v];  // every query sees at least its own key
      scalar_t* dst = out + (token * num_heads + item.kv_head * group + g) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc[v * head_dim + d] * inv);
    }
  }
}

template <typename scalar_t, int D>
void run_items(const std::vector<WorkItem>& items, const scalar_t* q, const scalar_t* k,
               const scalar_t* v, const int64_t* bt, const int64_t* cu_q, const int64_t* ctx,
               scalar_t* out, int64_t max_blocks, int64_t num_heads, int64_t num_kv_heads,
               int64_t head_dim, int64_t block_size, float scale) {
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      run_item<scalar_t, D>(items[i], q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                            num_kv_heads, head_dim, block_size, scale);
    }
  });
}

// A head_dim of 64 or 128 takes the register-blocked path (any cache dtype); the rest is
// scalar.
template <typename scalar_t>
void launch(const std::vector<WorkItem>& items, const scalar_t* q, const scalar_t* k,
            const scalar_t* v, const int64_t* bt, const int64_t* cu_q, const int64_t* ctx,
            scalar_t* out, int64_t max_blocks, int64_t num_heads, int64_t num_kv_heads,
            int64_t head_dim, int64_t block_size, float scale) {
  if (head_dim == 64) {
    return run_items<scalar_t, 64>(items, q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                                   num_kv_heads, head_dim, block_size, scale);
  }
  if (head_dim == 128) {
    return run_items<scalar_t, 128>(items, q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                                    num_kv_heads, head_dim, block_size, scale);
  }
  run_items<scalar_t, 0>(items, q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                         num_kv_heads, head_dim, block_size, scale);
}

}  // namespace

// query [T, H, D]; k_cache/v_cache [NB, BS, Hkv, D]; block_tables [S, MB] int64;
// cu_seqlens_q [S + 1] int64; context_lens [S] int64. Returns [T, H, D].
torch::Tensor paged_attention(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor cu_seqlens_q,
                              torch::Tensor context_lens, double scale) {
  TORCH_CHECK(query.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4, "paged_attention: bad ranks");
  TORCH_CHECK(k_cache.scalar_type() == query.scalar_type() &&
                  v_cache.scalar_type() == query.scalar_type(),
              "paged_attention: query and cache dtypes differ");
  query = query.contiguous();
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_attention: cache not contiguous");
  block_tables = block_tables.to(torch::kInt64).contiguous();
  cu_seqlens_q = cu_seqlens_q.to(torch::kInt64).contiguous();
  context_lens = context_lens.to(torch::kInt64).contiguous();
  const int64_t num_seqs = context_lens.size(0);
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "paged_attention: heads not a multiple of KV heads");
  TORCH_CHECK(k_cache.size(3) == head_dim, "paged_attention: head_dim mismatch");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "paged_attention: K and V caches differ in shape");
  TORCH_CHECK(cu_seqlens_q.size(0) == num_seqs + 1,
              "paged_attention: cu_seqlens_q must have one entry more than context_lens");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) >= num_seqs,
              "paged_attention: block_tables needs a row per sequence");
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* cu_q = cu_seqlens_q.data_ptr<int64_t>();
  const int64_t* ctx = context_lens.data_ptr<int64_t>();

  std::vector<WorkItem> items;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = cu_q[s + 1] - cu_q[s];
    TORCH_CHECK(q_len >= 0 && cu_q[s] >= 0 && cu_q[s + 1] <= query.size(0),
                "paged_attention: cu_seqlens_q out of order or past the queries");
    TORCH_CHECK(q_len <= ctx[s], "paged_attention: more queries than context");
    TORCH_CHECK((ctx[s] + block_size - 1) / block_size <= max_blocks || q_len == 0,
                "paged_attention: block table too short");
    for (int64_t t0 = 0; t0 < q_len; t0 += kQueryTile) {
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, t0, std::min(q_len, t0 + kQueryTile)});
    }
  }
  auto out = torch::empty_like(query);  // [T, H, D]
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    const scalar_t* q_ptr = query.data_ptr<scalar_t>();
    const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
    const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
    const int64_t* bt_ptr = block_tables.data_ptr<int64_t>();
    scalar_t* o_ptr = out.data_ptr<scalar_t>();
    launch<scalar_t>(items, q_ptr, k_ptr, v_ptr, bt_ptr, cu_q, ctx, o_ptr, max_blocks, num_heads,
                     num_kv_heads, head_dim, block_size, static_cast<float>(scale));
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention,
        "Paged attention over ragged query chunks with a cached prefix (CPU)");
}
