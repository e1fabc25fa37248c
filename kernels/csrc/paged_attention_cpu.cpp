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
// Two per-layer options (0 turns either off, and then nothing is done for it per key):
//   window W > 0  sliding window (Hugging Face's kv_idx > q_idx - W): the query at position p
//                 sees keys p - W < k <= p. A work item's block walk starts at the block
//                 holding its first query's window start, so blocks wholly before the window
//                 (and their table entries, which may be freed: -1 or reused) are never read,
//                 and work is proportional to the keys in the window; each query vector's
//                 lower bound is masked like its causal upper bound, once per block.
//   softcap c > 0 scores become c * tanh(score / c) after scaling, before masking (Gemma 2),
//                 on whole vectors (vtanh in cpu_vec.h, about 2 ulp).
//
// One work item is (sequence, tile of up to kQueryTile query tokens, segment of up to
// kSegmentKeys keys of its context), all heads (or a group of KV heads, when there are
// fewer items than threads); a tile whose context spans several segments
// is merged from their softmax states after the items ran (merge_partials), so a few long
// sequences still keep every thread busy, and the cut never depends on the batch. The tile's
// query vectors of a KV head (tokens x its query group) share every K/V row they read, and a
// block's rows of all heads (contiguous in the cache) are read in one visit, so K/V are
// pulled from memory once per tile. Scores are made kLanes keys at a time and reduced
// together (transpose_sum in cpu_vec.h), not one horizontal sum per key. Softmax is online
// (running max and denominator per query vector), accumulated in fp32 whatever the cache
// dtype. Work items run on torch's intra-op thread pool (at::parallel_for), so
// torch.set_num_threads governs them.
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
#include "prefetch.h"

namespace {

using namespace inflight_cpu;

constexpr int64_t kQueryTile = 8;
constexpr int64_t kChunkKeys = 256;  // keys scored before one softmax update (whole blocks)
// Keys of a segment (whole blocks, from block 0): a tile whose context spans several is
// cut into one work item per segment (WorkItem). Each cut costs a work item's set-up, its
// cold first blocks and a merge: with 256-key segments one layer of SmolLM2 took 1.16x
// the time of 512-key ones at 64 sequences x 300 keys, 1.10x at 8 x 300 and 1.11x at 128
// x 400, and the same at 256 x 150 (docs/kernels.md); a lone sequence of 300 keys ran 0.9x
// as long on two threads with 256. From 513 keys on a lone context is still cut.
#ifndef ATTN_SEGMENT_KEYS
#define ATTN_SEGMENT_KEYS 512
#endif
constexpr int64_t kSegmentKeys = ATTN_SEGMENT_KEYS;
// How many block visits ahead the reads are asked for (override with -D for tuning). On an
// Intel Xeon (AVX-512, 260 MB L3), 8 sequences x 300 keys x 30 layers took 7.6-8.1 ms at
// 1, 2, 4 and 8 alike: there the walk is bound by the core's read rate, not the distance.
#ifndef ATTN_PREFETCH_BLOCKS
#define ATTN_PREFETCH_BLOCKS 2
#endif
constexpr int64_t kPrefetchBlocks = ATTN_PREFETCH_BLOCKS;
// Whether a step with fewer work items than ATTN_ITEMS_PER_THREAD per thread cuts its
// tiles' KV heads into groups (1) or leaves threads idle (0), and whether a head group asks
// only for its heads' lines of each block (1) or for the whole block (0); for tuning (-D).
// On a 2-core Zen 4 VM, 30 layers of SmolLM2's shape, 16 MB read between layers as the
// linears would: one sequence of 300 keys took 0.69x the time cut in two head groups (0.75x
// asking for whole blocks, 0.78x in three one-head items with 4 items per thread wanted);
// at 2, 3, 5 and 8 sequences neither 2 nor 4 items per thread beat 1 beyond the rounds'
// spread of about 7% (docs/kernels.md). The outputs are the same bit for bit.
#ifndef ATTN_HEAD_CUT
#define ATTN_HEAD_CUT 1
#endif
#ifndef ATTN_ITEMS_PER_THREAD
#define ATTN_ITEMS_PER_THREAD 1
#endif
#ifndef ATTN_HEAD_PREFETCH
#define ATTN_HEAD_PREFETCH 1
#endif
// Up to how many query tokens a tile may have for each block's lines to be asked for into L1
// all at once right before the block is read (pull_to_l1 in prefetch.h); 0: never (for
// tuning, -D). Decode tiles (one token) read a block for little arithmetic and gain (0.78x
// to 0.89x the time on an AMD EPYC Zen 5, docs/kernels.md); tiles of 4 tokens neither gained
// nor lost, and 8-token prefill tiles took 1.06x the time with it.
#ifndef ATTN_PULL_MAX_TOKENS
#define ATTN_PULL_MAX_TOKENS 1
#endif

// A tile of a sequence's queries over one segment of its context: the blocks [block_begin,
// block_end) that it may see (its window's first block and its last key bound them too).
// A context longer than one segment (kSegmentKeys keys, whole blocks, from block 0) is cut
// into segments that are separate items, run in parallel, each leaving its softmax state
// (running max, sum and unnormalised output) in slot `partial`; merge_partials then folds
// them in segment order. The cut depends on the sequence alone, never on the batch beside
// it, so a sequence's output is the same in any batch; and a batch of few long contexts
// still keeps every thread busy.
struct WorkItem {
  int64_t seq;
  int64_t tile_start;  // first query token of the tile, 0-based within the sequence's chunk
  int64_t tile_end;    // one past the last
  int64_t block_begin = 0;
  int64_t block_end = std::numeric_limits<int64_t>::max();
  int64_t partial = -1;  // -1: the tile's whole context, written to the output
  int64_t head_begin = 0;  // the KV heads [head_begin, head_end) of the tile (all by default)
  int64_t head_end = std::numeric_limits<int64_t>::max();
};

// Where the softmax state of a segment item goes: per query vector (in run_item's order)
// its running max, its running sum and its head_dim unnormalised sums.
struct Partials {
  float* data = nullptr;
  int64_t item_stride = 0;  // floats per item slot: kQueryTile * num_heads * (head_dim + 2)
};

// scores[v * stride + j] = q[v] . K[j] for the block's keys j < n_keys, kLanes keys at a time: each
// key's products stay in one vector and transpose_sum turns kLanes of them into kLanes
// scores with one store. Keys from n_keys up to the next multiple of kLanes score 0 (the
// caller masks them); rows past n_keys are never read. One line of a later block is asked
// for per key and vector (pf).
template <typename scalar_t, int D>
inline void block_scores(const float* q, const scalar_t* k_rows, int64_t row_stride,
                         int64_t n_keys, int64_t nvec, float* scores, int64_t stride,
                         Prefetcher& pf) {
  constexpr int C = D / kLanes;
  for (int64_t j0 = 0; j0 < n_keys; j0 += kLanes) {
    const int64_t keys = std::min<int64_t>(kLanes, n_keys - j0);
    for (int64_t v = 0; v < nvec; ++v) {
      vf qr[C];  // the query vector, held in registers across the keys
      for (int c = 0; c < C; ++c) qr[c] = loadv(q + v * D + kLanes * c);
      vf part[kLanes];
      for (int jj = 0; jj < kLanes; ++jj) {
        pf.step();
        vf a = {}, b = {};  // two chains: a key's products are not one long dependency
        if (jj < keys) {
          const scalar_t* k_row = k_rows + (j0 + jj) * row_stride;
          for (int c = 0; c + 1 < C; c += 2) {
            a += qr[c] * loadv(k_row + kLanes * c);
            b += qr[c + 1] * loadv(k_row + kLanes * (c + 1));
          }
          if constexpr (C % 2 == 1) a += qr[C - 1] * loadv(k_row + kLanes * (C - 1));
        }
        part[jj] = a + b;
      }
      storev(scores + v * stride + j0, transpose_sum(part));
    }
  }
}

// acc[v] += sum_j p[v * stride + j] * V[j] over the block's keys, a vector's accumulator held in
// registers across the keys (a zero weight, a key the query may not see, is skipped). One
// line of a later block is asked for per key and vector (pf).
template <typename scalar_t, int D>
inline void block_values(const float* p, int64_t stride, const scalar_t* v_rows,
                         int64_t row_stride, int64_t n_keys, int64_t nvec, float* acc,
                         Prefetcher& pf) {
  constexpr int C = D / kLanes;
  for (int64_t v = 0; v < nvec; ++v) {
    const float* pv = p + v * stride;
    float* out = acc + v * D;
    vf a[C];
    for (int c = 0; c < C; ++c) a[c] = loadv(out + kLanes * c);
    for (int64_t j = 0; j < n_keys; ++j) {
      pf.step();
      const float w = pv[j];
      if (w == 0.f) continue;
      const vf wv = splat(w);
      const scalar_t* v_row = v_rows + j * row_stride;
      for (int c = 0; c < C; ++c) a[c] += wv * loadv(v_row + kLanes * c);
    }
    for (int c = 0; c < C; ++c) storev(out + kLanes * c, a[c]);
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

// Softmax of one chunk's scores for one query vector, folded into the running state:
// s[0, padded) holds the scores (-inf where the key is invisible or past its block's end);
// on return it holds the unnormalised weights e^(s - new_max), and acc, run_max and run_sum
// are rescaled and updated. Returns false when nothing in the chunk was visible.
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

// K[j] . q[v] for a block's keys j < n_keys and one KV head's query vectors, into
// scores[v * stride + j]. D == 0: any head_dim, scalar.
template <typename scalar_t, int D>
inline void score_block(const float* q, const scalar_t* k_rows, int64_t row_stride,
                        int64_t n_keys, int64_t nvec, int64_t head_dim, float* scores,
                        int64_t stride, Prefetcher& pf) {
  if constexpr (D > 0) {
    block_scores<scalar_t, D>(q, k_rows, row_stride, n_keys, nvec, scores, stride, pf);
  } else {
    for (int64_t j = 0; j < n_keys; ++j) {
      pf.step();
      for (int64_t v = 0; v < nvec; ++v) {
        scores[v * stride + j] = dot(q + v * head_dim, k_rows + j * row_stride, head_dim);
      }
    }
  }
}

// acc[v] += sum_j p[v * stride + j] * V[j] for a block's keys and one KV head's vectors.
template <typename scalar_t, int D>
inline void add_block_values(const float* p, int64_t stride, const scalar_t* v_rows,
                             int64_t row_stride, int64_t n_keys, int64_t nvec, int64_t head_dim,
                             float* acc, Prefetcher& pf) {
  if constexpr (D > 0) {
    block_values<scalar_t, D>(p, stride, v_rows, row_stride, n_keys, nvec, acc, pf);
  } else {
    for (int64_t j = 0; j < n_keys; ++j) {
      pf.step();
      for (int64_t v = 0; v < nvec; ++v) {
        const float w = p[v * stride + j];
        if (w != 0.f) axpy(w, v_rows + j * row_stride, acc + v * head_dim, head_dim);
      }
    }
  }
}

// The first key position a query at `pos` sees: 0 without a window (window == 0).
inline int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// Soft-caps the scores s[0, n) of one query vector in place: s = c * tanh(s / c) (n a
// multiple of kLanes).
inline void soft_cap(float* s, int64_t n, float softcap) {
  const vf c = splat(softcap);
  for (int64_t j = 0; j < n; j += kLanes) storev(s + j, c * vtanh(loadv(s + j) / c));
}

// What every work item of one call applies to its scores; 0 turns the window or the
// soft-cap off.
struct Options {
  float scale;     // multiplies q . k (folded into the query tile)
  int64_t window;  // sliding window in keys, the query's own included
  float softcap;   // logit soft-cap c: scores become c * tanh(score / c)
};

// One work item: a tile of a sequence's queries, every head. Its context (from the block
// holding the tile's first window start, block 0 without a window) is walked in chunks of
// whole blocks (about kChunkKeys keys): every key of the chunk is scored for every query
// vector, one softmax update per vector folds the chunk in, then the values are summed.
// Each block's K, then its V (block_size rows of all heads, contiguous) is read in one
// visit, so K/V come from memory once per tile; the lines of the visit kPrefetchBlocks
// ahead are asked for a line at a time during the arithmetic (prefetch.h), and a decode
// tile's block is asked for into L1 in one burst right before it is read (pull_to_l1).
// D > 0: a head_dim of D, vectorised with the cache widened to fp32 lanes as it is read;
// D == 0: any head_dim, scalar dot products and value sums.
template <typename scalar_t, int D>
void run_item(const WorkItem& item, const scalar_t* query, const scalar_t* k_cache,
              const scalar_t* v_cache, const int64_t* block_tables, const int64_t* cu_q,
              const int64_t* context_lens, scalar_t* out, int64_t max_blocks,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
              const Options& opt, const Partials& partials) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t group = num_heads / num_kv_heads;
  const int64_t q_start = cu_q[item.seq];
  const int64_t q_len = cu_q[item.seq + 1] - q_start;
  const int64_t first_pos = context_lens[item.seq] - q_len;  // position of the chunk's first query
  const int64_t tile_tokens = item.tile_end - item.tile_start;
  const int64_t per_head = tile_tokens * group;  // query vectors of one KV head
  const int64_t head_begin = item.head_begin, head_end = std::min(item.head_end, num_kv_heads);
  const int64_t heads = head_end - head_begin;  // the KV heads this item computes
  const int64_t nvec = per_head * heads;  // query vectors in this item
  const int64_t* table = block_tables + item.seq * max_blocks;
  const int64_t row_stride = num_kv_heads * head_dim;  // between consecutive slots
  const int64_t block_stride = block_size * row_stride;  // between blocks
  const int64_t block_bytes = block_stride * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t padded = (block_size + kLanes - 1) / kLanes * kLanes;  // a block's scores, whole vectors
  const int64_t tile_last_key = first_pos + item.tile_end - 1;
  // One past the last block read: the tile's last key's, or its segment's end.
  const int64_t num_blocks = std::min(item.block_end, tile_last_key / block_size + 1);
  // The first block read: the one holding the tile's first query's window start (no block
  // before it is read, nor its table entry), or its segment's first.
  const int64_t first_block = std::max(
      item.block_begin, window_start(first_pos + item.tile_start, opt.window) / block_size);
  const int64_t chunk_blocks = std::max<int64_t>(1, kChunkKeys / block_size);
  const int64_t width = std::min(chunk_blocks, num_blocks - first_block) * padded;  // scores per vector and chunk

  // q_tile[v][d] for v = (h - head_begin) * per_head + t * group + g (KV head h, token t,
  // member g of h's query group), pre-scaled; acc, run_max, run_sum, last_key and the score rows
  // ([nvec, width]: block c of the chunk at c * padded) are indexed the same way.
  std::vector<float> q_tile(nvec * head_dim);
  std::vector<float> acc(nvec * head_dim, 0.f);
  std::vector<float> run_max(nvec, kNegInf);
  std::vector<float> run_sum(nvec, 0.f);
  std::vector<int64_t> last_key(nvec);  // highest key position the vector may see
  std::vector<float> scores(nvec * width);
  for (int64_t h = head_begin; h < head_end; ++h) {
    for (int64_t t = 0; t < tile_tokens; ++t) {
      const int64_t token = q_start + item.tile_start + t;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t v = (h - head_begin) * per_head + t * group + g;
        const scalar_t* src = query + (token * num_heads + h * group + g) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) q_tile[v * head_dim + d] = static_cast<float>(src[d]) * opt.scale;
        last_key[v] = first_pos + item.tile_start + t;
      }
    }
  }
  auto keys_in = [&](int64_t b) { return std::min(block_size, tile_last_key + 1 - b * block_size); };
  // The blocks in the order they are read: a chunk's K blocks, then its V blocks, then the
  // next chunk's.
  std::vector<const scalar_t*> visits;  // each [block_size, Hkv, D]
  visits.reserve(2 * (num_blocks - first_block));
  for (int64_t c0 = first_block; c0 < num_blocks; c0 += chunk_blocks) {
    const int64_t c1 = std::min(num_blocks, c0 + chunk_blocks);
    for (int64_t b = c0; b < c1; ++b) visits.push_back(k_cache + table[b] * block_stride);
    for (int64_t b = c0; b < c1; ++b) visits.push_back(v_cache + table[b] * block_stride);
  }
  const auto num_visits = static_cast<int64_t>(visits.size());
  Prefetcher pf;
  // The lines of a visit this item reads: the whole block (one run), or its heads' part of
  // every slot (block_size runs, a slot apart), from `part_offset` elements into the block.
  const int64_t elem = static_cast<int64_t>(sizeof(scalar_t));
  const bool whole = heads == num_kv_heads || !ATTN_HEAD_PREFETCH;
  const int64_t part_offset = whole ? 0 : head_begin * head_dim;
  const int64_t part_rows = whole ? 1 : block_size;
  const int64_t part_run = whole ? block_bytes : heads * head_dim * elem;
  const int64_t part_stride = whole ? block_bytes : row_stride * elem;
  auto ask = [&](const scalar_t* block) { pf.start(block + part_offset, part_rows, part_run, part_stride); };
  for (int64_t i = 0; i < std::min(kPrefetchBlocks, num_visits); ++i) ask(visits[i]);
  int64_t visit = 0;
  const bool pull = tile_tokens <= ATTN_PULL_MAX_TOKENS;
  // The block to read now, its lines asked for into L1 all at once when the tile is short
  // (pull); the lines of its successor kPrefetchBlocks ahead start to be asked for.
  auto next_visit = [&]() {
    if (visit + kPrefetchBlocks < num_visits) ask(visits[visit + kPrefetchBlocks]);
    // Written out here, not in a lambda of its own: GCC 12 dropped the requests from such a
    // lambda's body (the build had no prefetcht0; `objdump -d <build>.so | grep -c prefetcht0`).
    if (pull) pull_to_l1(visits[visit] + part_offset, part_rows, part_run, part_stride);
    return visits[visit++];
  };
  for (int64_t c0 = first_block; c0 < num_blocks; c0 += chunk_blocks) {
    const int64_t c1 = std::min(num_blocks, c0 + chunk_blocks);
    for (int64_t b = c0; b < c1; ++b) {  // scores of every vector, a block's K at a time
      const scalar_t* k_block = next_visit();  // [block_size, Hkv, D]
      for (int64_t h = head_begin; h < head_end; ++h) {
        const int64_t first_v = (h - head_begin) * per_head;
        score_block<scalar_t, D>(q_tile.data() + first_v * head_dim, k_block + h * head_dim,
                                 row_stride, keys_in(b), per_head, head_dim,
                                 scores.data() + first_v * width + (b - c0) * padded, width, pf);
      }
    }
    const int64_t used = (c1 - c0) * padded;
    for (int64_t v = 0; v < nvec; ++v) {  // causal: a query sees no key after itself
      float* row = scores.data() + v * width;  // [used] this chunk's scores of vector v
      if (opt.softcap > 0.f) soft_cap(row, used, opt.softcap);  // before the masks, as in HF
      const int64_t first_key = window_start(last_key[v], opt.window);
      for (int64_t b = c0; b < c1; ++b) {
        float* block_row = row + (b - c0) * padded;  // [padded] block b's scores
        const int64_t visible = std::clamp<int64_t>(last_key[v] - b * block_size + 1, 0, keys_in(b));
        std::fill(block_row + visible, block_row + padded, kNegInf);
        if (opt.window > 0) {  // and none before its window
          const int64_t hidden = std::clamp<int64_t>(first_key - b * block_size, 0, visible);
          std::fill(block_row, block_row + hidden, kNegInf);
        }
      }
      softmax_block(row, used, acc.data() + v * head_dim, head_dim, run_max[v], run_sum[v]);
    }
    for (int64_t b = c0; b < c1; ++b) {  // acc += weights x V, a block's V at a time
      const scalar_t* v_block = next_visit();  // [block_size, Hkv, D]
      for (int64_t h = head_begin; h < head_end; ++h) {
        const int64_t first_v = (h - head_begin) * per_head;
        add_block_values<scalar_t, D>(scores.data() + first_v * width + (b - c0) * padded, width,
                                      v_block + h * head_dim, row_stride, keys_in(b), per_head,
                                      head_dim, acc.data() + first_v * head_dim, pf);
      }
    }
  }
  if (item.partial >= 0) {  // a segment: its state, for merge_partials
    float* state = partials.data + item.partial * partials.item_stride;
    for (int64_t v = 0; v < nvec; ++v) {  // at the vector's place among all heads' vectors
      float* dst = state + (head_begin * per_head + v) * (head_dim + 2);
      dst[0] = run_max[v];
      dst[1] = run_sum[v];
      std::copy(acc.data() + v * head_dim, acc.data() + (v + 1) * head_dim, dst + 2);
    }
    return;
  }
  for (int64_t h = head_begin; h < head_end; ++h) {
    for (int64_t t = 0; t < tile_tokens; ++t) {
      const int64_t token = q_start + item.tile_start + t;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t v = (h - head_begin) * per_head + t * group + g;
        const float inv = 1.f / run_sum[v];  // every query sees at least its own key
        scalar_t* dst = out + (token * num_heads + h * group + g) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc[v * head_dim + d] * inv);
      }
    }
  }
}

// Cut the items into `parts` contiguous runs of about equal work (query tokens x keys
// seen, from the tile's first window start, plus a fixed cost per item): contexts differ in
// length, so equal item counts would leave one thread waiting for the other at the end.
// Returns parts + 1 bounds.
std::vector<int64_t> split_by_work(const std::vector<WorkItem>& items, const int64_t* cu_q,
                                   const int64_t* ctx, int64_t window, int64_t block_size,
                                   int64_t num_kv_heads, int64_t parts) {
  constexpr int64_t kItemCost = 64;  // setting up an item, in key-token units
  std::vector<int64_t> cost(items.size());
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const WorkItem& it = items[i];
    const int64_t first_pos = ctx[it.seq] - (cu_q[it.seq + 1] - cu_q[it.seq]);
    const int64_t from = std::max(window_start(first_pos + it.tile_start, window),
                                  it.block_begin * block_size);
    const int64_t to = std::min(first_pos + it.tile_end,
                                it.block_end == std::numeric_limits<int64_t>::max()
                                    ? first_pos + it.tile_end : it.block_end * block_size);
    const int64_t heads = std::min(it.head_end, num_kv_heads) - it.head_begin;
    cost[i] = (it.tile_end - it.tile_start) * std::max<int64_t>(0, to - from) * heads / num_kv_heads + kItemCost;
    total += cost[i];
  }
  std::vector<int64_t> bounds{0};
  int64_t done = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    done += cost[i];
    const auto next = static_cast<int64_t>(bounds.size());  // the part this item would close
    if (next < parts && done * parts >= total * next) bounds.push_back(static_cast<int64_t>(i) + 1);
  }
  while (static_cast<int64_t>(bounds.size()) <= parts) bounds.push_back(static_cast<int64_t>(items.size()));
  return bounds;
}

// A tile whose context was cut into segments: its first segment's partial slot and how
// many there are (consecutive slots, in key order).
struct Merge {
  int64_t seq, tile_start, tile_end, first_partial, count;
};

// The output of every cut tile from its segments' states, folded in key order: the
// largest running max M, then sum = sum_i sum_i * e^(max_i - M) and out = (sum_i acc_i *
// e^(max_i - M)) / sum. A segment that saw no key (max -inf) adds nothing; every query
// sees its own key, so one segment at least saw one.
template <typename scalar_t>
void merge_partials(const std::vector<Merge>& merges, const Partials& partials,
                    const int64_t* cu_q, scalar_t* out, int64_t num_heads, int64_t num_kv_heads,
                    int64_t head_dim) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t group = num_heads / num_kv_heads;
  at::parallel_for(0, static_cast<int64_t>(merges.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(head_dim);
    for (int64_t m = begin; m < end; ++m) {
      const Merge& mg = merges[m];
      const int64_t tile_tokens = mg.tile_end - mg.tile_start;
      const int64_t per_head = tile_tokens * group;
      for (int64_t v = 0; v < per_head * num_kv_heads; ++v) {
        const int64_t h = v / per_head, t = (v % per_head) / group, g = v % group;
        auto state = [&](int64_t i) {
          return partials.data + (mg.first_partial + i) * partials.item_stride + v * (head_dim + 2);
        };
        float top = kNegInf;
        for (int64_t i = 0; i < mg.count; ++i) top = std::max(top, state(i)[0]);
        std::fill(acc.begin(), acc.end(), 0.f);
        float sum = 0.f;
        for (int64_t i = 0; i < mg.count; ++i) {
          const float* st = state(i);
          if (st[0] == kNegInf) continue;
          const float w = std::exp(st[0] - top);
          sum += st[1] * w;
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += st[2 + d] * w;
        }
        const int64_t token = cu_q[mg.seq] + mg.tile_start + t;
        scalar_t* dst = out + (token * num_heads + h * group + g) * head_dim;
        const float inv = 1.f / sum;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc[d] * inv);
      }
    }
  });
}

template <typename scalar_t, int D>
void run_items(const std::vector<WorkItem>& items, const scalar_t* q, const scalar_t* k,
               const scalar_t* v, const int64_t* bt, const int64_t* cu_q, const int64_t* ctx,
               scalar_t* out, int64_t max_blocks, int64_t num_heads, int64_t num_kv_heads,
               int64_t head_dim, int64_t block_size, const Options& opt,
               const Partials& partials) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items.size()));
  const std::vector<int64_t> bounds = split_by_work(items, cu_q, ctx, opt.window, block_size, num_kv_heads, parts);
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      for (int64_t i = bounds[part]; i < bounds[part + 1]; ++i) {
        run_item<scalar_t, D>(items[i], q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                              num_kv_heads, head_dim, block_size, opt, partials);
      }
    }
  });
}

// A head_dim of 64 or 128 takes the register-blocked path (any cache dtype); the rest is
// scalar.
template <typename scalar_t>
void launch(const std::vector<WorkItem>& items, const scalar_t* q, const scalar_t* k,
            const scalar_t* v, const int64_t* bt, const int64_t* cu_q, const int64_t* ctx,
            scalar_t* out, int64_t max_blocks, int64_t num_heads, int64_t num_kv_heads,
            int64_t head_dim, int64_t block_size, const Options& opt, const Partials& partials) {
  if (head_dim == 64) {
    return run_items<scalar_t, 64>(items, q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                                   num_kv_heads, head_dim, block_size, opt, partials);
  }
  if (head_dim == 128) {
    return run_items<scalar_t, 128>(items, q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                                    num_kv_heads, head_dim, block_size, opt, partials);
  }
  run_items<scalar_t, 0>(items, q, k, v, bt, cu_q, ctx, out, max_blocks, num_heads,
                         num_kv_heads, head_dim, block_size, opt, partials);
}

}  // namespace

// query [T, H, D]; k_cache/v_cache [NB, BS, Hkv, D]; block_tables [S, MB] int64;
// cu_seqlens_q [S + 1] int64; context_lens [S] int64; window >= 0 and softcap >= 0 (0: off).
// Returns [T, H, D].
torch::Tensor paged_attention(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor cu_seqlens_q,
                              torch::Tensor context_lens, double scale, int64_t window,
                              double softcap) {
  TORCH_CHECK(query.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: no sliding window)");
  TORCH_CHECK(softcap >= 0.0, "paged_attention: softcap must be >= 0 (0: no soft-capping)");
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

  // Segments of kSegmentKeys keys (whole blocks) from block 0: a tile whose blocks span
  // more than one is cut there (WorkItem).
  const int64_t segment_blocks = std::max<int64_t>(1, kSegmentKeys / block_size);
  std::vector<WorkItem> items;
  std::vector<Merge> merges;
  int64_t num_partials = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = cu_q[s + 1] - cu_q[s];
    TORCH_CHECK(q_len >= 0 && cu_q[s] >= 0 && cu_q[s + 1] <= query.size(0),
                "paged_attention: cu_seqlens_q out of order or past the queries");
    TORCH_CHECK(q_len <= ctx[s], "paged_attention: more queries than context");
    TORCH_CHECK((ctx[s] + block_size - 1) / block_size <= max_blocks || q_len == 0,
                "paged_attention: block table too short");
    for (int64_t t0 = 0; t0 < q_len; t0 += kQueryTile) {
      const int64_t t1 = std::min(q_len, t0 + kQueryTile);
      const int64_t first_pos = ctx[s] - q_len;
      const int64_t first_segment = window_start(first_pos + t0, window) / block_size / segment_blocks;
      const int64_t last_segment = (first_pos + t1 - 1) / block_size / segment_blocks;
      if (first_segment == last_segment) {
        items.push_back({s, t0, t1});
        continue;
      }
      merges.push_back({s, t0, t1, num_partials, last_segment - first_segment + 1});
      for (int64_t seg = first_segment; seg <= last_segment; ++seg) {
        items.push_back({s, t0, t1, seg * segment_blocks, (seg + 1) * segment_blocks, num_partials++});
      }
    }
  }
  // Fewer items than threads (a lone sequence or two, short contexts): each tile's KV heads
  // are cut into as many groups as it takes to give every thread some, each group an item of
  // its own. A head's query vectors are computed alike whichever item holds them (their
  // scores, softmax and sums never mix with another head's), so the output is unchanged.
  const auto threads = static_cast<int64_t>(at::get_num_threads());
  const auto num_items = static_cast<int64_t>(items.size());
  const int64_t wanted = threads * ATTN_ITEMS_PER_THREAD;
  if (ATTN_HEAD_CUT && num_items > 0 && num_items < wanted && num_kv_heads > 1) {
    const int64_t groups = std::min(num_kv_heads, (wanted + num_items - 1) / num_items);
    const int64_t per_group = (num_kv_heads + groups - 1) / groups;
    std::vector<WorkItem> cut;
    for (const WorkItem& whole : items) {
      for (int64_t h = 0; h < num_kv_heads; h += per_group) {
        WorkItem part = whole;
        part.head_begin = h;
        part.head_end = std::min(num_kv_heads, h + per_group);
        cut.push_back(part);
      }
    }
    items.swap(cut);
  }
  auto out = torch::empty_like(query);  // [T, H, D]
  std::vector<float> partial_states(num_partials * kQueryTile * num_heads * (head_dim + 2));
  const Partials partials{partial_states.data(), kQueryTile * num_heads * (head_dim + 2)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    const scalar_t* q_ptr = query.data_ptr<scalar_t>();
    const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
    const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
    const int64_t* bt_ptr = block_tables.data_ptr<int64_t>();
    scalar_t* o_ptr = out.data_ptr<scalar_t>();
    const Options opt{static_cast<float>(scale), window, static_cast<float>(softcap)};
    launch<scalar_t>(items, q_ptr, k_ptr, v_ptr, bt_ptr, cu_q, ctx, o_ptr, max_blocks, num_heads,
                     num_kv_heads, head_dim, block_size, opt, partials);
    merge_partials<scalar_t>(merges, partials, cu_q, o_ptr, num_heads, num_kv_heads, head_dim);
  });
  return out;
}

// key/value [T, Hkv, D] (rows may be strided: views of a fused qkv output); caches
// [NB, BS, Hkv, D]; slot_mapping [T]: token t's K and V rows go to slot block * BS + offset;
// a negative slot is skipped. One call for both caches instead of a handful of torch ops
// per layer (the copies are a few hundred bytes each).
void write_kv(torch::Tensor key, torch::Tensor value, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slot_mapping) {
  TORCH_CHECK(key.device().is_cpu() && k_cache.device().is_cpu(), "write_kv: CPU tensors only");
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes(), "write_kv: key and value must be [T, Hkv, D] alike");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "write_kv: K and V caches differ in shape");
  TORCH_CHECK(key.size(1) == k_cache.size(2) && key.size(2) == k_cache.size(3), "write_kv: head shape mismatch");
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() && value.scalar_type() == v_cache.scalar_type(),
              "write_kv: key/value and cache dtypes differ");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "write_kv: cache not contiguous");
  const int64_t row = key.size(1) * key.size(2);  // elements of one token's K (or V)
  if (key.stride(2) != 1 || key.stride(1) != key.size(2)) key = key.contiguous();
  if (value.stride(2) != 1 || value.stride(1) != value.size(2)) value = value.contiguous();
  slot_mapping = slot_mapping.to(torch::kInt64).contiguous();
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0), "write_kv: one slot per token");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < key.size(0); ++t) {
    TORCH_CHECK(slots[t] < num_slots, "write_kv: slot ", slots[t], " is past the pool's ", num_slots);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key.scalar_type(), "write_kv", [&] {
    const scalar_t* kp = key.data_ptr<scalar_t>();
    const scalar_t* vp = value.data_ptr<scalar_t>();
    scalar_t* kc = k_cache.data_ptr<scalar_t>();
    scalar_t* vc = v_cache.data_ptr<scalar_t>();
    for (int64_t t = 0; t < key.size(0); ++t) {
      if (slots[t] < 0) continue;
      std::memcpy(kc + slots[t] * row, kp + t * key.stride(0), row * sizeof(scalar_t));
      std::memcpy(vc + slots[t] * row, vp + t * value.stride(0), row * sizeof(scalar_t));
    }
  });
}

// tanh of each element of a float32 tensor through vtanh, the function the soft-cap uses
// (for the tests, which hold it to torch.tanh). Returns a new tensor of x's shape.
torch::Tensor vector_tanh(torch::Tensor x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "vector_tanh: CPU float32 only");
  const int64_t n = x.numel();
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  std::vector<float> buf(padded, 0.f);  // [padded] x, then zeros to whole vectors
  const torch::Tensor flat = x.contiguous().view(-1);  // [n]
  std::memcpy(buf.data(), flat.data_ptr<float>(), n * sizeof(float));
  for (int64_t j = 0; j < padded; j += kLanes) storev(buf.data() + j, vtanh(loadv(buf.data() + j)));
  torch::Tensor out = torch::empty_like(flat);  // [n]
  std::memcpy(out.data_ptr<float>(), buf.data(), n * sizeof(float));
  return out.view(x.sizes());
}

// decoder_cpu.cpp includes this file for its kernels and makes a module of its own.
#ifndef INFLIGHT_NO_MODULE
// Every entry point runs without the GIL (its arguments are converted before, its result
// after): a worker's other threads (intake, result writer, text-delta publisher) must not
// wait out a whole kernel call each time they need the interpreter.
using NoGil = py::call_guard<py::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention,
        "Paged attention over ragged query chunks with a cached prefix (CPU), optionally over a "
        "sliding window of keys and with soft-capped scores",
        py::arg("query"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("scale"), py::arg("window") = 0,
        py::arg("softcap") = 0.0, NoGil());
  m.def("vector_tanh", &vector_tanh, "tanh per element of a float32 tensor, as the soft-cap computes it",
        NoGil());
  m.def("write_kv", &write_kv, "Store each token's K and V rows at its slot (CPU); negative slots skipped",
        NoGil());
}
#endif  // INFLIGHT_NO_MODULE
