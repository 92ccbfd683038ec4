/* C ABI of the fused update kernels (ALGORITHMS.md sections 1-4) and the helper kernels
 * communication needs. The CPU backend implements it in native/cpu; the CUDA plugin implements
 * the same structs on device pointers. All buffers are fp32 and element counts are size_t.
 *
 * One call updates the elements [offset, offset + count) of every buffer it is given, so a whole
 * ParamSet or one communication bucket costs one call. */
#ifndef SAPIPE_KERNELS_H
#define SAPIPE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "sapipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sapipe_optimizer_kind {
  SAPIPE_OPTIMIZER_SGD = 0,
  SAPIPE_OPTIMIZER_ADAM = 1,
  SAPIPE_OPTIMIZER_ADAMW = 2
} sapipe_optimizer_kind;

typedef enum sapipe_compensation_kind {
  SAPIPE_COMPENSATION_NONE = 0,
  SAPIPE_COMPENSATION_ELEMENTWISE = 1, /* g + lambda*g*g*(w - w_c) */
  SAPIPE_COMPENSATION_ADAPTIVE = 2     /* g + lambda*g*g*(w - w_c)/sqrt(g*g + eps_dc) */
} sapipe_compensation_kind;

typedef enum sapipe_prediction_kind {
  SAPIPE_PREDICTION_NONE = 0,
  /* SAPipe-WP: a shadow optimizer step with an estimated gradient (section 3). */
  SAPIPE_PREDICTION_SHADOW_STEP = 1,
  /* w_hat = w - lr*s*D (PipeOptim, SpecTrain, linear weight prediction); D is the direction of the
   * optimizer (momentum buffer for SGD with momentum, the applied gradient for plain SGD, the
   * bias-corrected Adam direction for Adam/AdamW); AdamW also scales w by (1 - lr*wd)^s. */
  SAPIPE_PREDICTION_LINEAR = 2
} sapipe_prediction_kind;

typedef enum sapipe_gradient_estimate {
  SAPIPE_ESTIMATE_LOCAL = 0,          /* g_est = g_t (local) */
  SAPIPE_ESTIMATE_PREV_SYNC = 1,      /* g_est = A_{t-1} (the averaged gradient just applied) */
  SAPIPE_ESTIMATE_LOCAL_PREV_SYNC = 2 /* g_est = A_{t-1} + (g_t - g_{t-1})/n */
} sapipe_gradient_estimate;

typedef struct sapipe_update_config {
  int32_t optimizer; /* sapipe_optimizer_kind */
  float lr;
  float weight_decay;
  /* SGD */
  float momentum;
  float dampening;
  int32_t nesterov;
  /* 1 when the SGD momentum buffer holds nothing yet: the step sets m = d (PyTorch semantics). */
  int32_t momentum_is_empty;
  /* Spike compensation (SGD with momentum only): w -= lr*(a*m + b*d) with m = mu*m + d.
   * spike_delay < 0 disables it; a and b are derived from momentum and delay by the kernel. */
  int32_t spike_delay;
  /* Adam / AdamW */
  float beta1;
  float beta2;
  float eps;
  /* The optimizer step count this update produces (1 for the first update). */
  int64_t step;
  /* Every gradient element is multiplied by this on read (1/n averaging, loss-scale unscale). */
  float grad_scale;
  /* 1 when the caller already knows every gradient read is finite (sapipe_cpu_sum and the
   * all-reduce count non-finite results as they write them): the guard's extra read is skipped. */
  int32_t grad_checked;
  /* Delay compensation of the applied gradient, with backup-weights rotation. */
  int32_t compensation; /* sapipe_compensation_kind */
  float compensation_lambda;
  float compensation_eps;
  /* Weight prediction, written to buffers.w_hat. */
  int32_t prediction;          /* sapipe_prediction_kind */
  int32_t estimate;            /* sapipe_gradient_estimate, shadow step only */
  int32_t compensate_estimate; /* shadow step: apply delay compensation to g_est (needs compensation) */
  float world_size;            /* n in the local-prev-sync estimate */
  int32_t have_prev_local;     /* 0 on the first shadow step: local-prev-sync falls back to prev-sync */
  float local_grad_scale;      /* multiplier on local_grad and prev_local_grad reads */
  float prediction_steps;      /* s of the linear prediction */
} sapipe_update_config;

typedef struct sapipe_update_buffers {
  size_t offset;
  size_t count;
  float* weights;              /* w, read and written */
  const float* grad;           /* the gradient applied this step (A) */
  float* momentum;             /* SGD with momentum: m; Adam: first moment */
  float* second_moment;        /* Adam: v */
  float* backup;               /* delay compensation: w_c in, current w out */
  float* predicted;            /* weight prediction output w_hat */
  const float* local_grad;     /* shadow step with a local estimate: g_t */
  float* prev_local_grad;      /* local-prev-sync: g_{t-1} in, g_t out */
  /* Optional: the weights to update, read from here, with the updated weights written to
   * `weights` (an out-of-place step: the data-parallel trainer's double-buffered weights, read by
   * a forward pass while the next weights are written). Null: `weights` is read and written. */
  const float* weights_in;
} sapipe_update_buffers;

typedef struct sapipe_update_result {
  int32_t applied;           /* 0 when the non-finite guard skipped the step */
  int64_t non_finite_count;  /* non-finite gradient elements seen (0 when applied) */
} sapipe_update_result;

/* Bytes of memory traffic per element of one fused step as ALGORITHMS.md counts them. */
int32_t sapipe_update_bytes_per_element(const sapipe_update_config* config);

/* Validates config and buffers, checks every read gradient for NaN/Inf and, only if all are
 * finite, runs the single-pass update. Nothing is written when the step is skipped or invalid. */
sapipe_status sapipe_cpu_update(const sapipe_update_config* config,
                                const sapipe_update_buffers* buffers,
                                sapipe_update_result* result);

/* Elastic averaging (AvgPipe): d = alpha*(x - c); x -= d; c += d. */
sapipe_status sapipe_cpu_elastic_average(float* worker, float* center, size_t count, float alpha);

/* out = scale * sum_i inputs[i]. out may be one of the inputs. Returns the count of non-finite
 * results in *non_finite (may be NULL), so a reduction doubles as the non-finite guard. */
sapipe_status sapipe_cpu_sum(float* out, const float* const* inputs, size_t num_inputs,
                             size_t count, float scale, int64_t* non_finite);
sapipe_status sapipe_cpu_scale(float* x, size_t count, float scale);
/* y += a*x */
sapipe_status sapipe_cpu_axpy(float* y, const float* x, size_t count, float a);
/* sum of x[i]^2, accumulated in double. */
sapipe_status sapipe_cpu_squared_norm(const float* x, size_t count, double* out);
/* Count of NaN/Inf elements. */
sapipe_status sapipe_cpu_count_non_finite(const float* x, size_t count, int64_t* out);

/* MSTopK (ALGORITHMS.md section 6). x = grad + residual, formed in place in residual (error
 * feedback; residual NULL: x = grad, nothing written back). Selects exactly k elements by
 * multiple sampling (at most `rounds` sampling passes after the first), writes their indices in
 * ascending order and their values to out_indices/out_values, and zeroes them in the residual.
 * count must fit an int32; grad must be finite (the caller checks). stats may be NULL. */
typedef struct sapipe_topk_stats {
  int32_t passes;   /* reads of x after the one that formed it */
  float lower;      /* the final bracket: every |x| > upper is taken, the rest from (lower, upper] */
  float upper;
  int64_t band;     /* elements in (lower, upper] */
} sapipe_topk_stats;
sapipe_status sapipe_cpu_topk_select(const float* grad, float* residual, size_t count, size_t k, int32_t rounds,
                                     int32_t* out_indices, float* out_values, sapipe_topk_stats* stats);
/* The exact top-k by |x| (ties to the lower index), indices ascending: nth_element, for reference. */
sapipe_status sapipe_cpu_topk_exact(const float* x, size_t count, size_t k, int32_t* out_indices, float* out_values);
/* out[indices[i]] += scale * values[i]; every index must be in [0, count). */
sapipe_status sapipe_cpu_scatter_add(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale);

/* Bandwidth references for benchmarks: STREAM's triad a[i] = b[i] + s*c[i] on doubles
 * (24 B/element), and dst = src on floats (8 B/element). */
sapipe_status sapipe_cpu_triad(double* a, const double* b, const double* c, size_t count, double s);
sapipe_status sapipe_cpu_copy(float* dst, const float* src, size_t count);

#ifdef __cplusplus
}
#endif

#endif
