// The model operations (sapipe/nn.h) behind lib/nn, on host or device memory: each entry takes
// its operands as NativeBuffers (the CPU table runs the operation to completion) or CudaBuffers
// of one device (the CUDA plugin's table enqueues it on the device's current stream, CudaStream.run's,
// else the legacy default stream, in order with the device buffers' copies and updates there, and
// returns). Operands are dense row-major views at element offsets (a ParamSet tensor, an activation
// buffer), so a layer costs one call and no copy. Every view is checked against its buffer here; the kernels check again.
//
//   sgemm({ transA, transB, m, n, k, alpha, beta, a, aOffset, b, bOffset, c, cOffset })
//   nnBiasAdd(y, yOffset, bias, biasOffset, rows, cols)
//   nnBiasGrad(db, dbOffset, dy, dyOffset, rows, cols, accumulate)
//   nnRelu(y, yOffset, x, xOffset, count)
//   nnReluBackward(dx, dxOffset, y, yOffset, dy, dyOffset, count)
//   nnSoftmaxXent(logits, logitsOffset, labels, labelsOffset, rows, classes, gradScale,
//                 losses, lossesOffset, dlogits | null, dlogitsOffset, correct | null, correctOffset)
//   nnGelu(y, yOffset, x, xOffset, count)
//   nnGeluBackward(dx, dxOffset, x, xOffset, dy, dyOffset, count)
//   nnAdd(y, yOffset, a, aOffset, b, bOffset, count)
//   nnLayerNorm(y, yOffset, mean, meanOffset, rstd, rstdOffset, x, xOffset, gamma, gammaOffset,
//               beta, betaOffset, rows, cols, eps)
//   nnLayerNormBackward(dx, dxOffset, dgamma, dgammaOffset, dbeta, dbetaOffset, dy, dyOffset,
//                       x, xOffset, mean, meanOffset, rstd, rstdOffset, gamma, gammaOffset, rows, cols, accumulate)
//   nnEmbedding(y, yOffset, tokens, tokensOffset, tokenTable, tokenTableOffset, positionTable,
//               positionTableOffset, batch, seq, vocab, dim)
//   nnEmbeddingBackward(dtokenTable, dtokenTableOffset, dpositionTable | null, dpositionTableOffset,
//                       dy, dyOffset, tokens, tokensOffset, batch, seq, vocab, dim, accumulate)
//   nnDropout(y, yOffset, x, xOffset, count, p, seed, offset)
//   nnAttention(o, oOffset, lse, lseOffset, q, qOffset, k, kOffset, v, vOffset, batch, seq, heads, headDim, scale)
//   nnAttentionBackward(dq, dqOffset, dk, dkOffset, dv, dvOffset, dout, doutOffset, q, qOffset, k, kOffset,
//                       v, vOffset, o, oOffset, lse, lseOffset, batch, seq, heads, headDim, scale)
//   nnConv2d(y, yOffset, x, xOffset, w, wOffset, bias | null, biasOffset, shape)
//   nnConv2dBackward(dx | null, dxOffset, dw, dwOffset, db | null, dbOffset, dy, dyOffset, x, xOffset,
//                    w, wOffset, shape, accumulate)
//     shape: { batch, inChannels, height, width, outChannels, kernelH, kernelW, strideH, strideW, padH, padW }
//   nnPool2d(y, yOffset, x, xOffset, shape, mode)                 mode: 0 max, 1 average
//   nnPool2dBackward(dx, dxOffset, dy, dyOffset, x, xOffset, shape, mode)
#include <cstddef>
#include <string>
#include <vector>

#include "../core/cpu_clock.h"
#include "addon_data.h"
#include "device/cuda_binding.h"
#include "device/cuda_buffer.h"
#include "errors.h"
#include "js_args.h"
#include "native_buffer.h"
#include "nn_binding.h"
#include "sapipe/nn.h"

namespace sapipe::addon {
namespace {

// The operands of one operation: all host memory, or all memory of one device; each view holds
// its buffer alive for the call.
class Operands {
 public:
  Operands(Napi::Env env, const char* op) : env_(env), op_(op) {}

  // The view [offset, offset + count) of a NativeBuffer or CudaBuffer.
  float* view(const Napi::Value& value, const Napi::Value& offset_value, size_t count, const char* name) {
    const size_t offset = offset_value.IsUndefined() ? 0 : index_arg(env_, offset_value, (std::string(op_) + ": " + name + "Offset").c_str());
    const std::string what = std::string(op_) + ": " + name;
    float* base = nullptr;
    size_t length = 0;
    if (NativeBuffer::IsInstance(value)) {
      std::shared_ptr<AlignedBuffer> b = NativeBuffer::FromValue(env_, value, what.c_str());
      if (b->busy()) throw_error(env_, "ERR_BUSY", what + " is in use by a pending asynchronous operation; await it first");
      place(-1, what);
      base = b->data(), length = b->size();
      host_.push_back(std::move(b));
    } else {
      std::shared_ptr<DeviceAllocation> m = CudaBuffer::FromValue(env_, value, what.c_str());
      if (m->users.load() != 0) throw_error(env_, "ERR_BUSY", what + " is in use by a queued operation; await it first");
      place(m->device, what);
      base = m->data, length = m->length;
      device_.push_back(std::move(m));
    }
    if (offset > length || length - offset < count)
      throw_error(env_, "ERR_SIZE_MISMATCH", what + " needs " + std::to_string(count) + " elements from offset " + std::to_string(offset) +
                                                 ", but its buffer has " + std::to_string(length));
    return base + offset;
  }

  // An optional operand: null or undefined gives nullptr.
  float* optional_view(const Napi::Value& value, const Napi::Value& offset, size_t count, const char* name) {
    return value.IsNull() || value.IsUndefined() ? nullptr : view(value, offset, count, name);
  }

  // The table of the operands' memory (the device made current), once every operand was read.
  const sapipe_nn_ops* table() {
    if (place_ < 0) return sapipe_cpu_nn_ops();
    cuda_ = require_device_table(env_, place_);
    return cuda_->nn_ops();
  }

  // The stream a device operation is enqueued on: the device's current stream (a pipeline stage's,
  // set by CudaStream.run around the stage's synchronous work), else the legacy default stream.
  // Read after table(); the CPU table ignores it.
  void* stream() const { return place_ < 0 ? nullptr : AddonData::Get(env_).current_stream(place_); }

  // The table's entry `member`, refused when the table was built before the entry was appended.
  template <class Fn>
  Fn entry(const sapipe_nn_ops* table, Fn sapipe_nn_ops::*member, size_t end_offset) {
    if (table->table_size < end_offset || table->*member == nullptr)
      throw_error(env_, "ERR_BACKEND_UNAVAILABLE", std::string(op_) + ": the CUDA plugin predates this operation; rebuild it (npm run build:native)");
    return table->*member;
  }

  void check(sapipe_status status, const char* cpu_details) {
    if (status == SAPIPE_OK) return;
    throw_error(env_, sapipe_status_code(status), std::string(op_) + ": " + (cuda_ != nullptr ? cuda_->last_error() : cpu_details));
  }

 private:
  void place(int32_t where, const std::string& what) {
    if (place_ == kUnset) place_ = where;
    if (place_ != where)
      throw_error(env_, "ERR_INVALID_ARGUMENT", what + " is in " + describe(where) + " but an earlier operand is in " + describe(place_) +
                                                    "; copy it first (DeviceBuffer.from, copyToHost)");
  }
  static std::string describe(int32_t where) { return where < 0 ? "host memory" : "cuda:" + std::to_string(where); }

  static constexpr int32_t kUnset = -2;
  Napi::Env env_;
  const char* op_;
  int32_t place_ = kUnset;
  const sapipe_cuda_plugin_v1* cuda_ = nullptr;
  std::vector<std::shared_ptr<AlignedBuffer>> host_;
  std::vector<std::shared_ptr<DeviceAllocation>> device_;
};

size_t count_arg(Napi::Env env, const Napi::Value& v, const char* what) {
  // Dimensions above 2^31 would overflow the element counts long before memory runs out.
  const size_t n = index_arg(env, v, what);
  if (n > (size_t{1} << 31)) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be at most 2^31");
  return n;
}

Napi::Value Sgemm(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = expect_object(env, info[0], "sgemm options");
  sapipe_nn_gemm_args g{};
  g.trans_a = get_bool(o, "transA", false) ? 1 : 0;
  g.trans_b = get_bool(o, "transB", false) ? 1 : 0;
  g.m = get_index(o, "m", 0);
  g.n = get_index(o, "n", 0);
  g.k = get_index(o, "k", 0);
  constexpr size_t kMaxDim = size_t{1} << 31;
  if (g.m > kMaxDim || g.n > kMaxDim || g.k > kMaxDim)
    throw_error(env, "ERR_INVALID_ARGUMENT", "sgemm: m, n and k must be at most 2^31");
  g.alpha = static_cast<float>(get_number(o, "alpha", 1.0));
  g.beta = static_cast<float>(get_number(o, "beta", 0.0));
  Operands ops(env, "sgemm");
  g.a = ops.view(o.Get("a"), o.Get("aOffset"), g.m * g.k, "a");
  g.b = ops.view(o.Get("b"), o.Get("bOffset"), g.k * g.n, "b");
  g.c = ops.view(o.Get("c"), o.Get("cOffset"), g.m * g.n, "c");
  g.lda = g.trans_a ? g.m : g.k;
  g.ldb = g.trans_b ? g.k : g.n;
  g.ldc = g.n;
  const sapipe_nn_ops* table = ops.table();
  ops.check(table->gemm(&g, ops.stream()), "C must not overlap A or B; alpha and beta must be finite");
  return env.Undefined();
}

Napi::Value BiasAdd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t rows = count_arg(env, info[4], "nnBiasAdd: rows"), cols = count_arg(env, info[5], "nnBiasAdd: cols");
  Operands ops(env, "nnBiasAdd");
  float* y = ops.view(info[0], info[1], rows * cols, "y");
  const float* bias = ops.view(info[2], info[3], cols, "bias");
  const sapipe_nn_ops* table = ops.table();
  ops.check(table->bias_add(y, bias, rows, cols, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value BiasGrad(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t rows = count_arg(env, info[4], "nnBiasGrad: rows"), cols = count_arg(env, info[5], "nnBiasGrad: cols");
  const bool accumulate = info[6].ToBoolean().Value();
  Operands ops(env, "nnBiasGrad");
  float* db = ops.view(info[0], info[1], cols, "db");
  const float* dy = ops.view(info[2], info[3], rows * cols, "dy");
  const sapipe_nn_ops* table = ops.table();
  ops.check(table->bias_grad(db, dy, rows, cols, accumulate ? 1 : 0, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value Relu(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t count = count_arg(env, info[4], "nnRelu: count");
  Operands ops(env, "nnRelu");
  float* y = ops.view(info[0], info[1], count, "y");
  const float* x = ops.view(info[2], info[3], count, "x");
  const sapipe_nn_ops* table = ops.table();
  ops.check(table->relu(y, x, count, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value ReluBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t count = count_arg(env, info[6], "nnReluBackward: count");
  Operands ops(env, "nnReluBackward");
  float* dx = ops.view(info[0], info[1], count, "dx");
  const float* y = ops.view(info[2], info[3], count, "y");
  const float* dy = ops.view(info[4], info[5], count, "dy");
  const sapipe_nn_ops* table = ops.table();
  ops.check(table->relu_backward(dx, y, dy, count, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value SoftmaxXent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t rows = count_arg(env, info[4], "nnSoftmaxXent: rows"), classes = count_arg(env, info[5], "nnSoftmaxXent: classes");
  if (!info[6].IsNumber()) throw_error(env, "ERR_INVALID_ARGUMENT", "nnSoftmaxXent: gradScale must be a number");
  const float scale = static_cast<float>(info[6].As<Napi::Number>().DoubleValue());
  Operands ops(env, "nnSoftmaxXent");
  const float* logits = ops.view(info[0], info[1], rows * classes, "logits");
  const float* labels = ops.view(info[2], info[3], rows, "labels");
  float* losses = ops.view(info[7], info[8], rows, "losses");
  float* dlogits = ops.optional_view(info[9], info[10], rows * classes, "dlogits");
  float* correct = ops.optional_view(info[11], info[12], rows, "correct");
  const sapipe_nn_ops* table = ops.table();
  ops.check(table->softmax_xent(logits, labels, rows, classes, scale, losses, dlogits, correct, ops.stream()), "invalid arguments");
  return env.Undefined();
}

// The end of an entry in sapipe_nn_ops, for Operands::entry.
#define SAPIPE_NN_ENTRY(ops, table, name) ops.entry(table, &sapipe_nn_ops::name, offsetof(sapipe_nn_ops, name) + sizeof(void*))

float number_arg(Napi::Env env, const Napi::Value& v, const char* what) {
  if (!v.IsNumber()) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be a number");
  return static_cast<float>(v.As<Napi::Number>().DoubleValue());
}

Napi::Value Gelu(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t count = count_arg(env, info[4], "nnGelu: count");
  Operands ops(env, "nnGelu");
  float* y = ops.view(info[0], info[1], count, "y");
  const float* x = ops.view(info[2], info[3], count, "x");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, gelu)(y, x, count, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value GeluBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t count = count_arg(env, info[6], "nnGeluBackward: count");
  Operands ops(env, "nnGeluBackward");
  float* dx = ops.view(info[0], info[1], count, "dx");
  const float* x = ops.view(info[2], info[3], count, "x");
  const float* dy = ops.view(info[4], info[5], count, "dy");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, gelu_backward)(dx, x, dy, count, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value Add(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t count = count_arg(env, info[6], "nnAdd: count");
  Operands ops(env, "nnAdd");
  float* y = ops.view(info[0], info[1], count, "y");
  const float* a = ops.view(info[2], info[3], count, "a");
  const float* b = ops.view(info[4], info[5], count, "b");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, add)(y, a, b, count, ops.stream()), "invalid arguments");
  return env.Undefined();
}

Napi::Value LayerNorm(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t rows = count_arg(env, info[12], "nnLayerNorm: rows"), cols = count_arg(env, info[13], "nnLayerNorm: cols");
  const float eps = number_arg(env, info[14], "nnLayerNorm: eps");
  Operands ops(env, "nnLayerNorm");
  float* y = ops.view(info[0], info[1], rows * cols, "y");
  float* mean = ops.view(info[2], info[3], rows, "mean");
  float* rstd = ops.view(info[4], info[5], rows, "rstd");
  const float* x = ops.view(info[6], info[7], rows * cols, "x");
  const float* gamma = ops.view(info[8], info[9], cols, "gamma");
  const float* beta = ops.view(info[10], info[11], cols, "beta");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, layer_norm)(y, mean, rstd, x, gamma, beta, rows, cols, eps, ops.stream()),
            "cols must be positive and eps positive and finite");
  return env.Undefined();
}

Napi::Value LayerNormBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t rows = count_arg(env, info[16], "nnLayerNormBackward: rows"), cols = count_arg(env, info[17], "nnLayerNormBackward: cols");
  const bool accumulate = info[18].ToBoolean().Value();
  Operands ops(env, "nnLayerNormBackward");
  float* dx = ops.view(info[0], info[1], rows * cols, "dx");
  float* dgamma = ops.view(info[2], info[3], cols, "dgamma");
  float* dbeta = ops.view(info[4], info[5], cols, "dbeta");
  const float* dy = ops.view(info[6], info[7], rows * cols, "dy");
  const float* x = ops.view(info[8], info[9], rows * cols, "x");
  const float* mean = ops.view(info[10], info[11], rows, "mean");
  const float* rstd = ops.view(info[12], info[13], rows, "rstd");
  const float* gamma = ops.view(info[14], info[15], cols, "gamma");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, layer_norm_backward)(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, cols, accumulate ? 1 : 0,
                                                             ops.stream()),
            "invalid arguments");
  return env.Undefined();
}

Napi::Value Embedding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t batch = count_arg(env, info[8], "nnEmbedding: batch"), seq = count_arg(env, info[9], "nnEmbedding: seq");
  const size_t vocab = count_arg(env, info[10], "nnEmbedding: vocab"), dim = count_arg(env, info[11], "nnEmbedding: dim");
  Operands ops(env, "nnEmbedding");
  float* y = ops.view(info[0], info[1], batch * seq * dim, "y");
  const float* tokens = ops.view(info[2], info[3], batch * seq, "tokens");
  const float* token_table = ops.view(info[4], info[5], vocab * dim, "tokenTable");
  const float* position_table = ops.view(info[6], info[7], seq * dim, "positionTable");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, embedding)(y, tokens, token_table, position_table, batch, seq, vocab, dim, ops.stream()),
            "invalid arguments");
  return env.Undefined();
}

Napi::Value EmbeddingBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t batch = count_arg(env, info[8], "nnEmbeddingBackward: batch"), seq = count_arg(env, info[9], "nnEmbeddingBackward: seq");
  const size_t vocab = count_arg(env, info[10], "nnEmbeddingBackward: vocab"), dim = count_arg(env, info[11], "nnEmbeddingBackward: dim");
  const bool accumulate = info[12].ToBoolean().Value();
  Operands ops(env, "nnEmbeddingBackward");
  float* dtoken = ops.view(info[0], info[1], vocab * dim, "dtokenTable");
  float* dposition = ops.optional_view(info[2], info[3], seq * dim, "dpositionTable");
  const float* dy = ops.view(info[4], info[5], batch * seq * dim, "dy");
  const float* tokens = ops.view(info[6], info[7], batch * seq, "tokens");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, embedding_backward)(dtoken, dposition, dy, tokens, batch, seq, vocab, dim, accumulate ? 1 : 0,
                                                            ops.stream()),
            "invalid arguments");
  return env.Undefined();
}

Napi::Value Dropout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t count = count_arg(env, info[4], "nnDropout: count");
  const float p = number_arg(env, info[5], "nnDropout: p");
  const uint64_t seed = index_arg(env, info[6], "nnDropout: seed");
  const uint64_t offset = index_arg(env, info[7], "nnDropout: offset");
  Operands ops(env, "nnDropout");
  float* y = ops.view(info[0], info[1], count, "y");
  const float* x = ops.view(info[2], info[3], count, "x");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, dropout)(y, x, count, p, seed, offset, ops.stream()), "p must be in [0, 1)");
  return env.Undefined();
}

Napi::Value Attention(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t batch = count_arg(env, info[10], "nnAttention: batch"), seq = count_arg(env, info[11], "nnAttention: seq");
  const size_t heads = count_arg(env, info[12], "nnAttention: heads"), dim = count_arg(env, info[13], "nnAttention: headDim");
  const float scale = number_arg(env, info[14], "nnAttention: scale");
  const size_t n = batch * seq * heads * dim;
  Operands ops(env, "nnAttention");
  float* o = ops.view(info[0], info[1], n, "o");
  float* lse = ops.view(info[2], info[3], batch * heads * seq, "lse");
  const float* q = ops.view(info[4], info[5], n, "q");
  const float* k = ops.view(info[6], info[7], n, "k");
  const float* v = ops.view(info[8], info[9], n, "v");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, attention)(o, lse, q, k, v, batch, seq, heads, dim, scale, ops.stream()),
            "headDim must be in [1, 256] and scale finite");
  return env.Undefined();
}

Napi::Value AttentionBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t batch = count_arg(env, info[18], "nnAttentionBackward: batch"), seq = count_arg(env, info[19], "nnAttentionBackward: seq");
  const size_t heads = count_arg(env, info[20], "nnAttentionBackward: heads"), dim = count_arg(env, info[21], "nnAttentionBackward: headDim");
  const float scale = number_arg(env, info[22], "nnAttentionBackward: scale");
  const size_t n = batch * seq * heads * dim;
  Operands ops(env, "nnAttentionBackward");
  float* dq = ops.view(info[0], info[1], n, "dq");
  float* dk = ops.view(info[2], info[3], n, "dk");
  float* dv = ops.view(info[4], info[5], n, "dv");
  const float* dout = ops.view(info[6], info[7], n, "dout");
  const float* q = ops.view(info[8], info[9], n, "q");
  const float* k = ops.view(info[10], info[11], n, "k");
  const float* v = ops.view(info[12], info[13], n, "v");
  const float* o = ops.view(info[14], info[15], n, "o");
  const float* lse = ops.view(info[16], info[17], batch * heads * seq, "lse");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, attention_backward)(dq, dk, dv, dout, q, k, v, o, lse, batch, seq, heads, dim, scale, ops.stream()),
            "headDim must be in [1, 256] and scale finite");
  return env.Undefined();
}

// A convolution's shape from its JS object, with the output size; refused when no output fits.
sapipe_nn_conv2d_shape conv_shape_arg(Napi::Env env, const Napi::Value& v, const char* op, size_t* out_h, size_t* out_w) {
  Napi::Object o = expect_object(env, v, (std::string(op) + " shape").c_str());
  sapipe_nn_conv2d_shape s{};
  s.batch = get_index(o, "batch", 0), s.in_channels = get_index(o, "inChannels", 0);
  s.height = get_index(o, "height", 0), s.width = get_index(o, "width", 0);
  s.out_channels = get_index(o, "outChannels", 0), s.kernel_h = get_index(o, "kernelH", 0), s.kernel_w = get_index(o, "kernelW", 0);
  s.stride_h = get_index(o, "strideH", 1), s.stride_w = get_index(o, "strideW", 1);
  s.pad_h = get_index(o, "padH", 0), s.pad_w = get_index(o, "padW", 0);
  constexpr size_t kMax = size_t{1} << 31;
  for (size_t x : {s.batch, s.in_channels, s.height, s.width, s.out_channels, s.kernel_h, s.kernel_w, s.stride_h, s.stride_w, s.pad_h, s.pad_w})
    if (x > kMax) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(op) + ": every shape field must be at most 2^31");
  *out_h = sapipe_nn_conv_out(s.height, s.kernel_h, s.stride_h, s.pad_h);
  *out_w = sapipe_nn_conv_out(s.width, s.kernel_w, s.stride_w, s.pad_w);
  if (*out_h == 0 || *out_w == 0)
    throw_error(env, "ERR_INVALID_ARGUMENT", std::string(op) + ": kernel and stride must be at least 1 and height + 2 padH, width + 2 padW at least the kernel");
  return s;
}

Napi::Value Conv2d(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t oh = 0, ow = 0;
  const sapipe_nn_conv2d_shape s = conv_shape_arg(env, info[8], "nnConv2d", &oh, &ow);
  Operands ops(env, "nnConv2d");
  float* y = ops.view(info[0], info[1], s.batch * s.out_channels * oh * ow, "y");
  const float* x = ops.view(info[2], info[3], s.batch * s.in_channels * s.height * s.width, "x");
  const float* w = ops.view(info[4], info[5], s.out_channels * s.in_channels * s.kernel_h * s.kernel_w, "w");
  const float* bias = ops.optional_view(info[6], info[7], s.out_channels, "bias");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, conv2d)(y, x, w, bias, &s, ops.stream()), "invalid arguments or out of memory");
  return env.Undefined();
}

Napi::Value Conv2dBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t oh = 0, ow = 0;
  const sapipe_nn_conv2d_shape s = conv_shape_arg(env, info[12], "nnConv2dBackward", &oh, &ow);
  const bool accumulate = info[13].ToBoolean().Value();
  const size_t xlen = s.batch * s.in_channels * s.height * s.width, wlen = s.out_channels * s.in_channels * s.kernel_h * s.kernel_w;
  Operands ops(env, "nnConv2dBackward");
  float* dx = ops.optional_view(info[0], info[1], xlen, "dx");
  float* dw = ops.view(info[2], info[3], wlen, "dw");
  float* db = ops.optional_view(info[4], info[5], s.out_channels, "db");
  const float* dy = ops.view(info[6], info[7], s.batch * s.out_channels * oh * ow, "dy");
  const float* x = ops.view(info[8], info[9], xlen, "x");
  const float* w = ops.view(info[10], info[11], wlen, "w");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, conv2d_backward)(dx, dw, db, dy, x, w, &s, accumulate ? 1 : 0, ops.stream()),
            "invalid arguments or out of memory");
  return env.Undefined();
}

int32_t pool_mode_arg(Napi::Env env, const Napi::Value& v, const char* op) {
  if (!v.IsNumber()) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(op) + ": mode must be 0 (max) or 1 (average)");
  const double m = v.As<Napi::Number>().DoubleValue();
  if (m != SAPIPE_NN_POOL_MAX && m != SAPIPE_NN_POOL_AVG) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(op) + ": mode must be 0 (max) or 1 (average)");
  return static_cast<int32_t>(m);
}

Napi::Value Pool2d(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t oh = 0, ow = 0;
  const sapipe_nn_conv2d_shape s = conv_shape_arg(env, info[4], "nnPool2d", &oh, &ow);
  const int32_t mode = pool_mode_arg(env, info[5], "nnPool2d");
  Operands ops(env, "nnPool2d");
  float* y = ops.view(info[0], info[1], s.batch * s.in_channels * oh * ow, "y");
  const float* x = ops.view(info[2], info[3], s.batch * s.in_channels * s.height * s.width, "x");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, pool2d)(y, x, &s, mode, ops.stream()), "padding must be at most half the kernel");
  return env.Undefined();
}

Napi::Value Pool2dBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t oh = 0, ow = 0;
  const sapipe_nn_conv2d_shape s = conv_shape_arg(env, info[6], "nnPool2dBackward", &oh, &ow);
  const int32_t mode = pool_mode_arg(env, info[7], "nnPool2dBackward");
  const size_t xlen = s.batch * s.in_channels * s.height * s.width;
  Operands ops(env, "nnPool2dBackward");
  float* dx = ops.view(info[0], info[1], xlen, "dx");
  const float* dy = ops.view(info[2], info[3], s.batch * s.in_channels * oh * ow, "dy");
  const float* x = ops.view(info[4], info[5], xlen, "x");
  const sapipe_nn_ops* table = ops.table();
  ops.check(SAPIPE_NN_ENTRY(ops, table, pool2d_backward)(dx, dy, x, &s, mode, ops.stream()), "padding must be at most half the kernel");
  return env.Undefined();
}

// measureClockGhz(): the core clock the kernels run at (native/core/cpu_clock.h).
Napi::Value MeasureClockGhz(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), measure_cpu_clock_ghz()); }

}  // namespace

void InitNn(Napi::Env env, Napi::Object exports) {
  exports.Set("sgemm", Napi::Function::New(env, Sgemm, "sgemm"));
  exports.Set("nnBiasAdd", Napi::Function::New(env, BiasAdd, "nnBiasAdd"));
  exports.Set("nnBiasGrad", Napi::Function::New(env, BiasGrad, "nnBiasGrad"));
  exports.Set("nnRelu", Napi::Function::New(env, Relu, "nnRelu"));
  exports.Set("nnReluBackward", Napi::Function::New(env, ReluBackward, "nnReluBackward"));
  exports.Set("nnSoftmaxXent", Napi::Function::New(env, SoftmaxXent, "nnSoftmaxXent"));
  exports.Set("nnGelu", Napi::Function::New(env, Gelu, "nnGelu"));
  exports.Set("nnGeluBackward", Napi::Function::New(env, GeluBackward, "nnGeluBackward"));
  exports.Set("nnAdd", Napi::Function::New(env, Add, "nnAdd"));
  exports.Set("nnLayerNorm", Napi::Function::New(env, LayerNorm, "nnLayerNorm"));
  exports.Set("nnLayerNormBackward", Napi::Function::New(env, LayerNormBackward, "nnLayerNormBackward"));
  exports.Set("nnEmbedding", Napi::Function::New(env, Embedding, "nnEmbedding"));
  exports.Set("nnEmbeddingBackward", Napi::Function::New(env, EmbeddingBackward, "nnEmbeddingBackward"));
  exports.Set("nnDropout", Napi::Function::New(env, Dropout, "nnDropout"));
  exports.Set("nnAttention", Napi::Function::New(env, Attention, "nnAttention"));
  exports.Set("nnAttentionBackward", Napi::Function::New(env, AttentionBackward, "nnAttentionBackward"));
  exports.Set("nnConv2d", Napi::Function::New(env, Conv2d, "nnConv2d"));
  exports.Set("nnConv2dBackward", Napi::Function::New(env, Conv2dBackward, "nnConv2dBackward"));
  exports.Set("nnPool2d", Napi::Function::New(env, Pool2d, "nnPool2d"));
  exports.Set("nnPool2dBackward", Napi::Function::New(env, Pool2dBackward, "nnPool2dBackward"));
  exports.Set("measureClockGhz", Napi::Function::New(env, MeasureClockGhz, "measureClockGhz"));
}

}  // namespace sapipe::addon
