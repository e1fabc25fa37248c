// fp32 linear layers on the CPU: y = x W^T + b from a weight packed once into column panels.
//
// The weight W [N, K] (out features, in features) is packed by kernels/cpu_linear_native.py
// into panels of kNr output columns: panel p holds W[p*kNr + j, k] at [p][k][j], zero-padded
// past N, so a panel is one contiguous run of K * kNr floats and the whole weight is read
// front to back once per block of rows. A register tile of up to kMr rows x kNr columns
// keeps its sums in vector registers while it walks k: per k, two vector loads of the panel
// and one broadcast per row feed 2 * rows fused multiply-adds.
//
// At a decode step's row counts (1 to ~16) the work is bound by reading the weight from
// memory: the tile covers every row, each weight element is loaded once and the loop
// streams at memory speed. At larger row counts the rows are walked in blocks of kMc, each
// block re-reading the panels (from cache when they fit), and the tile runs at the FMA
// units' rate. Threads split the panels (output columns) between them: no two write one
// output, and each reads only its share of the weight.
//
// The memory is kept busy while the FMAs run: every line of the panel block to be read
// next is asked for (into L2) during the current block, spread over its register tiles and
// their k steps (Ahead), so reading the next block overlaps the arithmetic on this one
// (docs/kernels.md: 0.75-0.90x the time from 1 to 256 rows on an Intel Xeon, against the
// 8 KB-ahead request before it). Without it the reads waited on the arithmetic: the second
// and later tiles of a block ran from cache with the memory idle. Calls of one tile's rows
// leave the panels to the hardware prefetcher (LINEAR_AHEAD_MIN_ROWS below).
//
// The panels hold fp32, or bf16 where every value of the weight is a bf16 value (a bf16
// checkpoint computed in fp32): a bf16 panel vector is widened to fp32 lanes as it is
// loaded (a shift into the high half of each lane, exact), and everything else is the same,
// so the outputs are those of the fp32 panels bit for bit, from half the bytes.
//
// Every output row is computed by the same sequence of operations whatever the number of
// rows, its block or its place in a tile: sums over k in blocks of kKc, one FMA chain per
// block, each block's sum added to the output in k order, then the bias. A sequence's
// result therefore never depends on the batch it runs in (the engine's batch invariance).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <array>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_vec.h"

namespace {

using inflight_cpu::kLanes;
using inflight_cpu::splat;
using inflight_cpu::vf;

// Tile shape and blocking (override with -D for tuning; kernels/cpu_linear.py builds the
// defaults). AVX-512: 8 rows x 3 vectors (48 columns) = 24 sums + 3 panel vectors + 1
// broadcast of the 32 registers; AVX2: 4 rows x 3 vectors (24 columns) = 12 sums + 3 + 1
// of 16. Measured on an AMD EPYC with AVX-512, one thread, SmolLM2's projections: 8 x 48
// ran 12 x 32's decode rates and reached oneDNN's at 64-256 rows, where 12 x 32 stayed
// 10-25% behind. On an AVX2-only AMD EPYC (Zen 4), two threads, all of SmolLM2's linears
// back to back, against 6 x 16: 0.84x the time at 1 row, 0.89x at 4, 0.83x at 8, 0.93x
// at 16, the same at 64 and 256 (medians of paired runs; docs/kernels.md). With 6 x 16, 8
// rows were a 6-row tile and a 2-row one whose 4 FMA chains wait on the FMA latency, and
// a single row had 2 chains against 3 now; 2 x 32 read 1-2 rows fastest but lost 23-44%
// from 8 rows on.
#if defined(__AVX512F__)
#define LINEAR_DEFAULT_NV 3
#define LINEAR_DEFAULT_MR 8
#else
#define LINEAR_DEFAULT_NV 3
#define LINEAR_DEFAULT_MR 4
#endif
#ifndef LINEAR_NV
#define LINEAR_NV LINEAR_DEFAULT_NV
#endif
#ifndef LINEAR_MR
#define LINEAR_MR LINEAR_DEFAULT_MR
#endif
#ifndef LINEAR_KC
#define LINEAR_KC 384
#endif
#ifndef LINEAR_MC_ROWS
#define LINEAR_MC_ROWS 128
#endif
// Floats ahead of the tile's k at which the current panel's lines are also asked for (into
// L1), 0 for none, the default. This near prefetch (8 KB ahead) was what first brought a
// decode step's 8-16 rows to the read rate of one (the hardware prefetcher alone left them
// at 60-70% on an AMD EPYC). With the whole next block asked for (Ahead) it adds little:
// on an Intel Xeon, with both, 1 row took 1.03-1.14x the time of the ahead request alone
// in three sets of rounds and 1.01x in a fourth, 4-32 rows 0.96-1.05x (docs/kernels.md);
// off by default for the shorter loop. On an AMD EPYC Zen 3 it took 0.88x the time at 8
// rows, 1.02-1.05x at 1 and 64 (docs/kernels.md).
#ifndef LINEAR_PF
#define LINEAR_PF 0
#endif
// Whether the next block's lines are asked for (Ahead; 0: the hardware prefetcher alone),
// and into which cache. On an AMD EPYC Zen 3, 0 took 0.85-0.91x the time at 1-2 rows and
// 1.09-1.16x at 16 (docs/kernels.md); on the Intel Xeon it took 0.75-0.91x the time of the
// 8 KB-ahead request from 1 to 256 rows (against none it was not measured there).
#ifndef LINEAR_AHEAD
#define LINEAR_AHEAD 1
#endif
// The fewest rows of a call for which the next block is asked for (Ahead): one more than a
// register tile holds (5 in the AVX2 build, 9 in the AVX-512 one). A call of one tile
// streams each panel once, in order, which the hardware prefetcher follows alone; the
// request exists for blocks of several tiles, whose later tiles run from cache with
// nothing being read. Against none, the request took 1.10-1.19x the time at 1 row and
// 1.07-1.17x at 2-4 on a Zen 2 (AVX2), 1.11-1.20x at 1 and 1.10x at 2 on a Zen 3 (AVX2),
// and in the AVX-512 build on a Zen 5 1.05-1.29x at 1-2 rows, 1.01-1.11x at 4-8 (against a
// build identical to it, 0.96-1.03x); from 9 rows the two read alike there, and from 16
// rows the request won 8-14% on the Zen 2 and Zen 3 (docs/kernels.md). On an Intel Xeon
// with AMX the same rule took 1.24-1.39x the time of asking in every call at 4-8 rows, so
// kernels/cpu_linear.py builds Intel CPUs' kernel with 1 here (docs/kernels.md).
#ifndef LINEAR_AHEAD_MIN_ROWS
#define LINEAR_AHEAD_MIN_ROWS (LINEAR_MR + 1)
#endif
#ifndef LINEAR_AHEAD_HINT
#define LINEAR_AHEAD_HINT _MM_HINT_T1
#endif
constexpr int kNv = LINEAR_NV;  // vectors per panel row
constexpr int kNr = kNv * kLanes;  // columns of a panel
constexpr int kMr = LINEAR_MR;  // rows of a register tile
constexpr int64_t kKc = LINEAR_KC;  // k per block: a panel's block (kKc * kNr floats) stays in L1/L2
constexpr int64_t kMc = (LINEAR_MC_ROWS + kMr - 1) / kMr * kMr;  // rows per block, whole tiles
static_assert(kMr * kNv + kNv + 1 <= (kLanes == 16 ? 32 : 16), "the tile must fit the registers");

inline vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#endif
}

// A panel's element types: fp32, or bf16 widened to fp32 as it is loaded.
using bf16 = c10::BFloat16;

// One float in every lane, loaded straight from memory (one vbroadcastss).
inline vf broadcast(const float* p) {
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(*p);
#else
  return (vf)_mm256_broadcast_ss(p);
#endif
}

inline vf loadu(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// A share of the lines of the panel block to be read after the current one, asked for into
// L2 `per_k` lines per k step of a register tile, until the share is done.
struct Ahead {
  const char* next = nullptr;  // the next line to ask for
  const char* end = nullptr;   // one past the share's last line
  int64_t per_k = 0;

  inline void step() {
    for (int64_t j = 0; j < per_k && next < end; ++j, next += 64) _mm_prefetch(next, LINEAR_AHEAD_HINT);
  }
};

// The sums of one register tile: rows [0, MR) of `a` (row stride lda) times a panel block
// `b` ([kc][kNr]), one FMA chain per row and vector over k; `ahead` is asked for meanwhile
// when `Ask` (without it the loop carries no request at all). A bf16 block's vectors are
// widened as they are loaded, and also stored to `spill` ([kc][kNr] fp32) when it is not
// null, for the block's later tiles to read.
template <int MR, bool Ask, typename W>
inline void tile_sums(int64_t kc, const float* a, int64_t lda, const W* b, vf (&sum)[MR][kNv],
                      Ahead ahead, float* spill) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) sum[i][v] = splat(0.f);
  for (int64_t k = 0; k < kc; ++k) {
    vf bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = inflight_cpu::loadv(b + k * kNr + v * kLanes);
    if constexpr (!std::is_same_v<W, float>) {
      if (spill != nullptr) {
#pragma GCC unroll 4
        for (int v = 0; v < kNv; ++v) inflight_cpu::storev(spill + k * kNr + v * kLanes, bv[v]);
      }
    }
#if LINEAR_PF > 0
#pragma GCC unroll 4
    for (int64_t o = 0; o < kNr * static_cast<int64_t>(sizeof(W)); o += 64)  // each line of the panel row
      _mm_prefetch(reinterpret_cast<const char*>(b + k * kNr + LINEAR_PF) + o, _MM_HINT_T0);
#endif
    if constexpr (Ask) ahead.step();
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const vf x = broadcast(a + i * lda + k);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) sum[i][v] = fmadd(x, bv[v], sum[i][v]);
    }
  }
}

// One register tile into `c` (row stride ldc): its sums added to what `c` holds when
// `accumulate`, else stored; then `bias` (kNr values, or null) added. A panel narrower
// than kNr (`cols`, the weight's last) writes only its first `cols` columns.
template <int MR, bool Ask, typename W>
void tile(int64_t kc, const float* a, int64_t lda, const W* b, float* c, int64_t ldc,
          bool accumulate, const float* bias, int cols, Ahead ahead, float* spill) {
  vf sum[MR][kNv];
  tile_sums<MR, Ask, W>(kc, a, lda, b, sum, ahead, spill);
  if (cols == kNr) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* out = c + i * ldc;
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) {
        vf x = accumulate ? loadu(out + v * kLanes) + sum[i][v] : sum[i][v];
        if (bias) x = x + loadu(bias + v * kLanes);
        std::memcpy(out + v * kLanes, &x, sizeof(vf));
      }
    }
    return;
  }
#pragma GCC unroll 16  // whole: a sum indexed at run time would keep them all in memory
  for (int i = 0; i < MR; ++i) {
    float row[kNr];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) inflight_cpu::storev(row + v * kLanes, sum[i][v]);
    float* out = c + i * ldc;
    for (int j = 0; j < cols; ++j) {
      const float v = accumulate ? out[j] + row[j] : row[j];
      out[j] = bias ? v + bias[j] : v;
    }
  }
}

template <typename W>
using TileFn = void (*)(int64_t, const float*, int64_t, const W*, float*, int64_t, bool,
                        const float*, int, Ahead, float*);

template <bool Ask, typename W, int... R>
constexpr std::array<TileFn<W>, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&tile<R + 1, Ask, W>...};
}
// The register tiles by row count (index rows - 1), asking for the next block or not.
template <typename W>
constexpr auto kAskingTiles = tiles<true, W>(std::make_integer_sequence<int, kMr>{});
template <typename W>
constexpr auto kQuietTiles = tiles<false, W>(std::make_integer_sequence<int, kMr>{});

// The panel block read after block k0 of panel p in row block r0 ([kc][kNr] elements from
// the pointer; kc 0 when none follows in this call): the panel's next k block, the next
// panel's first, the first panel's again for the next row block, or `after` (the first
// block of the caller's next call, or null).
template <typename W>
std::pair<const W*, int64_t> following_block(const W* w, int64_t m, int64_t k, int64_t p_begin,
                                             int64_t p_end, int64_t r0, int64_t p, int64_t k0,
                                             const W* after) {
  if (k0 + kKc < k) return {w + (p * k + k0 + kKc) * kNr, std::min(kKc, k - k0 - kKc)};
  if (p + 1 < p_end) return {w + (p + 1) * k * kNr, std::min(kKc, k)};
  if (r0 + kMc < m) return {w + p_begin * k * kNr, std::min(kKc, k)};
  return {after, after ? std::min(kKc, k) : 0};
}

// Panels [p_begin, p_end) for every row: rows in blocks of kMc, each block over the panels,
// each panel over its k blocks, each k block over the block's register tiles, which ask for
// the following block's lines between them (Ahead), tile t for the t-th share. `after` is
// the first panel block the caller reads next (its lines are asked for during the last
// block), or null. A bf16 block's first tile widens each vector as it loads it; where later
// tiles read the block too, the first also stores the widened block (`wide`, kept in
// cache) and they read that: widening in every tile took 1.13x the time of fp32 panels at
// 64 rows, and widening the block alone before its tiles (a step in which the FMA units
// wait) 1.04-1.09x at 16-48 rows.
template <typename W>
void run_panels(const float* x, int64_t lda, const W* w, const float* bias, float* y,
                int64_t m, int64_t n, int64_t k, int64_t p_begin, int64_t p_end,
                const W* after = nullptr) {
  const bool ask = LINEAR_AHEAD && m >= LINEAR_AHEAD_MIN_ROWS;
  const auto& tile_fns = ask ? kAskingTiles<W> : kQuietTiles<W>;
  const auto& wide_fns = ask ? kAskingTiles<float> : kQuietTiles<float>;
  // [kKc][kNr], uninitialised (only bf16 panels under several tiles use it)
  const bool widens = !std::is_same_v<W, float> && m > kMr;
  const std::unique_ptr<float[]> wide(widens ? new float[kKc * kNr] : nullptr);
  for (int64_t r0 = 0; r0 < m; r0 += kMc) {
    const int64_t rows = std::min(kMc, m - r0);
    const int64_t tiles = (rows + kMr - 1) / kMr;
    for (int64_t p = p_begin; p < p_end; ++p) {
      const W* panel = w + p * k * kNr;  // [k][kNr]
      const int64_t col0 = p * kNr;
      const int cols = static_cast<int>(std::min<int64_t>(kNr, n - col0));
      for (int64_t k0 = 0; k0 < k; k0 += kKc) {
        const int64_t kc = std::min(kKc, k - k0);
        const bool accumulate = k0 > 0, last = k0 + kc == k;
        const float* b = bias && last ? bias + col0 : nullptr;
        const auto [next, next_kc] = following_block(w, m, k, p_begin, p_end, r0, p, k0, after);
        const int64_t lines = next_kc * kNr * static_cast<int64_t>(sizeof(W)) / 64;
        const int64_t share = (lines + tiles - 1) / tiles;  // lines per tile
        const char* next_bytes = reinterpret_cast<const char*>(next);
        const W* block = panel + k0 * kNr;  // [kc][kNr]
        float* spill = widens && tiles > 1 ? wide.get() : nullptr;  // the first tile fills it
        for (int64_t i0 = 0, t = 0; i0 < rows; i0 += kMr, ++t) {
          const int mr = static_cast<int>(std::min<int64_t>(kMr, rows - i0));
          const float* a = x + (r0 + i0) * lda + k0;
          float* c = y + (r0 + i0) * n + col0;
          Ahead ahead;
          if (ask && next != nullptr) {
            const int64_t from = std::min(lines, t * share), to = std::min(lines, from + share);
            ahead = {next_bytes + from * 64, next_bytes + to * 64, (share + kc - 1) / kc};
          }
          if (spill != nullptr && t > 0) {
            wide_fns[mr - 1](kc, a, lda, spill, c, n, accumulate, b, cols, ahead, nullptr);
          } else {
            tile_fns[mr - 1](kc, a, lda, block, c, n, accumulate, b, cols, ahead, spill);
          }
        }
      }
    }
  }
}

}  // namespace

int64_t panel_width() { return kNr; }

// Whether `packed` holds panels of an element type the kernel reads: fp32 or bf16.
bool panel_dtype(const torch::Tensor& packed) {
  return packed.scalar_type() == torch::kFloat32 || packed.scalar_type() == torch::kBFloat16;
}

// x [M, K] (rows may be strided, elements contiguous), packed [P, K, kNr] fp32 or bf16,
// bias [N] or None -> [M, N] fp32.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be a float32 [M, K] matrix");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kNr && packed.is_contiguous() && panel_dtype(packed),
              "packed weight must be a contiguous float32 or bfloat16 [P, K, ", kNr, "] tensor");
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0);
  TORCH_CHECK(packed.size(1) == k, "x has ", k, " columns, the weight ", packed.size(1));
  TORCH_CHECK(n > (panels - 1) * kNr && n <= panels * kNr, "n=", n, " does not match ", panels, " panels");
  torch::Tensor xs = x.stride(1) == 1 ? x : x.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == torch::kFloat32 && b.numel() == n, "bias must be float32 [", n, "]");
  }
  auto y = torch::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  if (k == 0) return b.defined() ? y.copy_(b.expand({m, n})) : y.zero_();
  const float* xp = xs.data_ptr<float>();
  const int64_t lda = xs.stride(0);
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  auto run = [&](const auto* wp) {
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      run_panels(xp, lda, wp, bp, yp, m, n, k, begin, end);
    });
  };
  if (packed.scalar_type() == torch::kBFloat16) {
    run(packed.data_ptr<bf16>());
  } else {
    run(packed.data_ptr<float>());
  }
  return y;
}

// A mixture of experts' matmuls in one call: x [M, K] holds the rows routed to each expert
// one expert after another, rows offsets[e]..offsets[e+1] going to packed[e] ([P, K, kNr],
// every expert the same shape) -> [M, n]. The work items are (expert, panel) pairs of the
// experts that have rows, split between the threads; each runs exactly what linear() runs
// for that expert's rows and panel, so the result is the one of a call per expert.
torch::Tensor grouped_linear(const torch::Tensor& x, const std::vector<int64_t>& offsets,
                             const std::vector<torch::Tensor>& packed, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be a float32 [M, K] matrix");
  TORCH_CHECK(!packed.empty() && offsets.size() == packed.size() + 1,
              "offsets must hold one more entry than there are experts");
  const int64_t m = x.size(0), k = x.size(1), panels = packed[0].size(0);
  TORCH_CHECK(offsets.front() == 0 && offsets.back() == m, "offsets must run from 0 to ", m);
  TORCH_CHECK(n > (panels - 1) * kNr && n <= panels * kNr, "n=", n, " does not match ", panels, " panels");
  const auto dtype = packed[0].scalar_type();
  TORCH_CHECK(panel_dtype(packed[0]), "packed weights must be float32 or bfloat16");
  std::vector<std::pair<int64_t, int64_t>> items;  // (expert, panel) of the experts with rows
  for (size_t e = 0; e < packed.size(); ++e) {
    const torch::Tensor& w = packed[e];
    TORCH_CHECK(w.dim() == 3 && w.size(0) == panels && w.size(1) == k && w.size(2) == kNr &&
                    w.is_contiguous() && w.scalar_type() == dtype,
                "expert ", e, "'s packed weight must be a contiguous [", panels, ", ", k, ", ", kNr,
                "] tensor of the first expert's dtype");
    TORCH_CHECK(offsets[e + 1] >= offsets[e], "offsets must not decrease");
    if (offsets[e + 1] > offsets[e]) {
      for (int64_t p = 0; p < panels; ++p) items.emplace_back(static_cast<int64_t>(e), p);
    }
  }
  auto y = torch::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  if (k == 0) return y.zero_();
  torch::Tensor xs = x.stride(1) == 1 ? x : x.contiguous();
  const float* xp = xs.data_ptr<float>();
  const int64_t lda = xs.stride(0);
  float* yp = y.data_ptr<float>();
  auto run = [&](auto element) {
    using W = decltype(element);
    std::vector<const W*> weights;
    for (const auto& w : packed) weights.push_back(w.data_ptr<W>());
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto [e, p] = items[i];
        const int64_t first = offsets[e], rows = offsets[e + 1] - first;
        const W* after = nullptr;  // the next item's first block, read next on this thread
        if (i + 1 < end) after = weights[items[i + 1].first] + items[i + 1].second * k * kNr;
        run_panels(xp + first * lda, lda, weights[e], nullptr, yp + first * n, rows, n, k, p, p + 1,
                   after);
      }
    });
  };
  if (dtype == torch::kBFloat16) {
    run(bf16{});
  } else {
    run(float{});
  }
  return y;
}

// decoder_cpu.cpp includes this file for its kernels and makes a module of its own.
#ifndef INFLIGHT_NO_MODULE
// The matmul runs without the GIL (as every kernel entry point: paged_attention_cpu.cpp),
// so the worker's other threads never wait out a step's linears for the interpreter.
using NoGil = pybind11::call_guard<pybind11::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("panel_width", &panel_width, "output columns per packed panel (kNv vectors)");
  mod.def("linear", &linear, "x W^T + b from a weight packed into column panels (fp32 or bf16)",
          NoGil());
  mod.def("grouped_linear", &grouped_linear,
          "each expert's rows times its packed weight, every expert in one call (fp32 or bf16)",
          NoGil());
}
#endif  // INFLIGHT_NO_MODULE
