// Software prefetch for kernels that read blocks scattered through a pool (the paged KV
// cache): the hardware cannot guess where the next block is, so the kernel names it.
//
// The lines of a block to be read later (the caller chooses how far ahead; the attention
// kernel, two block visits) are asked for one at a time between the arithmetic
// (Prefetcher::step in the inner loops), not all at once: a burst of a whole block's
// requests (192 lines for a 12 KB K block) fills the core's miss buffers and stalls it
// until the memory answers, so the reads and the arithmetic took turns instead of
// overlapping. Spread out, one SmolLM2 decode-attention layer at 256 sequences x 150
// tokens went from about 100 to about 55 ns per key on an AMD EPYC (docs/kernels.md).
// The lines go to L2 (prefetcht1): L1 is too small to hold a block ahead of use.

#pragma once

#include <cstdint>

namespace inflight_cpu {

constexpr int kPrefetchLocality = 2;  // __builtin_prefetch's "moderate" locality: prefetcht1
constexpr int64_t kCacheLine = 64;

class Prefetcher {
 public:
  // Start on [p, p + bytes), first asking for whatever is left of the previous range.
  void start(const void* p, int64_t bytes) { start(p, 1, bytes, bytes); }

  // Start on `rows` runs of `run` bytes, `stride` bytes apart from p (some heads of every
  // slot of a KV block), first asking for whatever is left of the previous range.
  void start(const void* p, int64_t rows, int64_t run, int64_t stride) {
    finish();
    row_ = next_ = static_cast<const char*>(p);
    end_ = next_ + run;
    rows_left_ = run > 0 ? rows : 0;
    run_ = run;
    stride_ = stride;
  }

  // Ask for the next line of the range, if any is left.
  inline void step() {
    if (next_ >= end_) {
      if (rows_left_ <= 1) return;
      --rows_left_;
      row_ += stride_;
      next_ = row_;
      end_ = row_ + run_;
    }
    __builtin_prefetch(next_, 0, kPrefetchLocality);
    next_ += kCacheLine;
  }

  // Ask for every line left.
  void finish() {
    while (next_ < end_ || rows_left_ > 1) step();
  }

 private:
  const char* row_ = nullptr;
  const char* next_ = nullptr;
  const char* end_ = nullptr;
  int64_t rows_left_ = 0;
  int64_t run_ = 0;
  int64_t stride_ = 0;
};

// Ask for every line of `rows` runs of `run` bytes, `stride` bytes apart from p, into L1 at
// once: for the block about to be read, whose lines the Prefetcher asked for into L2 earlier.
// Read without it, the block's lines come to L1 one miss at a time as the arithmetic walks
// them (each head's part of every slot in turn, a strided pattern), and the reading and the
// arithmetic add up; asked for together they arrive in parallel. On an AMD EPYC Zen 5, 30
// layers of SmolLM2's decode attention took 0.78x to 0.89x the time over randomly placed
// blocks and 0.71x to 0.83x over each sequence's blocks in one run, from 1 to 128 sequences
// (docs/kernels.md); the same lines read by loads instead took as long.
inline void pull_to_l1(const void* p, int64_t rows, int64_t run, int64_t stride) {
  const char* row = static_cast<const char*>(p);
  for (int64_t r = 0; r < rows; ++r, row += stride) {
    for (int64_t off = 0; off < run; off += kCacheLine) __builtin_prefetch(row + off, 0, 3);
  }
}

}  // namespace inflight_cpu
