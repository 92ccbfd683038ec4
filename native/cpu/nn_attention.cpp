// Causal self-attention as blocked matrix products. For each (batch, head), the queries are taken
// kQueryTile rows at a time; a tile's scores against the keys it may see (j <= its last row) are
// one SGEMM into a per-thread strip [tile, keys], softmaxed in place (exactly: every visible key
// of a row is in the strip, so there is no running rescale), and multiplied into V by a second
// SGEMM. Only the strip exists, never the [seq, seq] score matrix. The backward recomputes each
// tile's probabilities from the saved lse and takes dq, dk and dv as four more products per tile.
//
// Why not a row at a time: a head's dot products are short (head_dim numbers), so a row-by-row
// loop spends its time on loop overhead and one exp per score; as tiles, the work is the SIMD
// SGEMM's, and the exps run vectorised (nn_elementwise.h).
//
// Every (batch, head) of the backward runs on one thread (its dk and dv sum over the tiles, in
// tile order), the forward's tiles are independent, and the SGEMMs run on the calling thread, so
// the results do not depend on the thread count.
#include "nn_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "../core/thread_pool.h"
#include "nn_elementwise.h"
#include "nn_jobs.h"
#include "sapipe/nn.h"

namespace sapipe::cpu {
namespace {

constexpr size_t kQueryTile = 32;

struct AttentionShape {
  size_t batch, seq, heads, dim;
  size_t width() const { return heads * dim; }
  size_t heads_total() const { return batch * heads; }
  size_t tiles() const { return (seq + kQueryTile - 1) / kQueryTile; }
  // The offset of row i of head h of batch b in a [batch, seq, heads * dim] tensor.
  size_t at(size_t b, size_t h, size_t i) const { return (b * seq + i) * width() + h * dim; }
  size_t lse_at(size_t b, size_t h, size_t i) const { return (b * heads + h) * seq + i; }
};

// The query rows [first, first + rows) of a tile, and the keys it sees: [0, keys).
struct Tile {
  size_t first, rows, keys;
};
Tile tile_of(const AttentionShape& a, size_t t) {
  const size_t first = t * kQueryTile, rows = std::min(kQueryTile, a.seq - first);
  return {first, rows, first + rows};
}

bool args_ok(size_t head_dim, float scale) { return head_dim >= 1 && head_dim <= SAPIPE_NN_MAX_HEAD_DIM && std::isfinite(scale); }

// One strip of kQueryTile x seq floats (count of them) per pool thread, allocated before the pool
// runs, so nothing in a worker allocates (or throws).
class Strips {
 public:
  bool allocate(size_t seq, size_t count) {
    per_thread_ = count * kQueryTile * seq;
    try {
      data_.resize(per_thread_ * static_cast<size_t>(ThreadPool::current().size()));
    } catch (const std::bad_alloc&) {
      return false;
    }
    return true;
  }
  float* of(int thread) { return data_.data() + static_cast<size_t>(thread) * per_thread_; }

 private:
  std::vector<float> data_;
  size_t per_thread_ = 0;
};

// Runs body(thread, unit) for units [0, count), split over the pool; `work` (a unit's rough size)
// keeps small problems on the calling thread.
template <class Body>
void for_units(size_t count, size_t work, Body&& body) {
  split_units(count, [&](int thread, size_t lo, size_t hi) {
    for (size_t u = lo; u < hi; ++u) body(thread, u);
  }, work);
}

// Scores of a tile: strip[r, j] = scale (q_{first+r} . k_j) for j < keys.
sapipe_status tile_scores(const AttentionShape& a, const Tile& t, size_t b, size_t h, const float* q, const float* k, float scale,
                          float* strip) {
  return serial_product(false, true, t.rows, t.keys, a.dim, scale, q + a.at(b, h, t.first), a.width(), k + a.at(b, h, 0), a.width(), 0.0f,
                 strip, t.keys);
}

}  // namespace

sapipe_status attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, size_t batch, size_t seq,
                                size_t heads, size_t head_dim, float scale) {
  const AttentionShape a{batch, seq, heads, head_dim};
  if (a.heads_total() == 0 || seq == 0) return SAPIPE_OK;
  if (o == nullptr || lse == nullptr || q == nullptr || k == nullptr || v == nullptr || !args_ok(head_dim, scale))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  Strips strips;
  if (!strips.allocate(seq, 1)) return SAPIPE_ERR_OUT_OF_MEMORY;
  const NnElementKernels& ek = active_nn_element_kernels();
  const size_t tiles = a.tiles();
  FirstError failure;  // a product refused (an output over an input, against the contract) fails the call
  for_units(a.heads_total() * tiles, kQueryTile * seq * head_dim, [&](int thread, size_t unit) {
    const size_t bh = unit / tiles, b = bh / heads, h = bh % heads;
    const Tile t = tile_of(a, unit % tiles);
    float* strip = strips.of(thread);
    failure.set(tile_scores(a, t, b, h, q, k, scale, strip));
    for (size_t r = 0; r < t.rows; ++r) {
      float* row = strip + r * t.keys;
      const size_t visible = t.first + r + 1;  // keys j <= i
      float m = -std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < visible; ++j) m = std::max(m, row[j]);
      const float sum = ek.exp_shifted(row, row, visible, m);
      const float inv = 1.0f / sum;
      for (size_t j = 0; j < visible; ++j) row[j] *= inv;
      std::fill(row + visible, row + t.keys, 0.0f);
      lse[a.lse_at(b, h, t.first + r)] = m + std::log(sum);
    }
    failure.set(serial_product(false, false, t.rows, head_dim, t.keys, 1.0f, strip, t.keys, v + a.at(b, h, 0), a.width(), 0.0f,
                         o + a.at(b, h, t.first), a.width()));
  });
  return failure.get();
}

sapipe_status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                 const float* o, const float* lse, size_t batch, size_t seq, size_t heads, size_t head_dim, float scale) {
  const AttentionShape a{batch, seq, heads, head_dim};
  if (a.heads_total() == 0 || seq == 0) return SAPIPE_OK;
  if (dq == nullptr || dk == nullptr || dv == nullptr || dout == nullptr || q == nullptr || k == nullptr || v == nullptr ||
      o == nullptr || lse == nullptr || !args_ok(head_dim, scale))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  Strips strips;  // per thread: the tile's probabilities, then their gradients
  if (!strips.allocate(seq, 2)) return SAPIPE_ERR_OUT_OF_MEMORY;
  const NnElementKernels& ek = active_nn_element_kernels();
  FirstError failure;
  for_units(a.heads_total(), seq * seq * head_dim, [&](int thread, size_t bh) {
    const size_t b = bh / heads, h = bh % heads, w = a.width();
    float* p = strips.of(thread);
    float* ds = p + kQueryTile * seq;
    for (size_t j = 0; j < seq; ++j) {
      std::fill(dk + a.at(b, h, j), dk + a.at(b, h, j) + head_dim, 0.0f);
      std::fill(dv + a.at(b, h, j), dv + a.at(b, h, j) + head_dim, 0.0f);
    }
    for (size_t ti = 0; ti < a.tiles(); ++ti) {
      const Tile t = tile_of(a, ti);
      const float* dout_t = dout + a.at(b, h, t.first);
      failure.set(tile_scores(a, t, b, h, q, k, scale, p));
      // dp[r, j] = dout_i . v_j, into the second strip.
      failure.set(serial_product(false, true, t.rows, t.keys, head_dim, 1.0f, dout_t, w, v + a.at(b, h, 0), w, 0.0f, ds, t.keys));
      for (size_t r = 0; r < t.rows; ++r) {
        const size_t i = t.first + r, visible = i + 1;
        float* p_row = p + r * t.keys;
        float* ds_row = ds + r * t.keys;
        ek.exp_shifted(p_row, p_row, visible, lse[a.lse_at(b, h, i)]);
        const float* dout_i = dout + a.at(b, h, i);
        const float* o_i = o + a.at(b, h, i);
        float d_i = 0.0f;  // D_i = dout_i . o_i
        for (size_t d = 0; d < head_dim; ++d) d_i += dout_i[d] * o_i[d];
        for (size_t j = 0; j < visible; ++j) ds_row[j] = p_row[j] * (ds_row[j] - d_i);
        std::fill(p_row + visible, p_row + t.keys, 0.0f);
        std::fill(ds_row + visible, ds_row + t.keys, 0.0f);
      }
      // dq_t = scale ds K;  dk[0, keys) += scale ds^T q_t;  dv[0, keys) += p^T dout_t.
      failure.set(serial_product(false, false, t.rows, head_dim, t.keys, scale, ds, t.keys, k + a.at(b, h, 0), w, 0.0f, dq + a.at(b, h, t.first), w));
      failure.set(serial_product(true, false, t.keys, head_dim, t.rows, scale, ds, t.keys, q + a.at(b, h, t.first), w, 1.0f, dk + a.at(b, h, 0), w));
      failure.set(serial_product(true, false, t.keys, head_dim, t.rows, 1.0f, p, t.keys, dout_t, w, 1.0f, dv + a.at(b, h, 0), w));
    }
  });
  return failure.get();
}

}  // namespace sapipe::cpu
