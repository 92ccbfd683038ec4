#include "scalar_reference.h"

#include <cmath>


namespace sapipe::tests {
namespace {

double compensate(const sapipe_update_config& c, double g, double w_now, double w_then) {
  double r = c.compensation_lambda * g * g * (w_now - w_then);
  if (c.compensation == SAPIPE_COMPENSATION_ADAPTIVE) r /= std::sqrt(g * g + static_cast<double>(c.compensation_eps));
  return g + r;
}

double adam_direction(const sapipe_update_config& c, double m, double v, int64_t t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t));
  return (m / bc1) / (std::sqrt(v / bc2) + c.eps);
}

}  // namespace

bool reference_update(const sapipe_update_config& c, const sapipe_update_buffers& b) {
  const bool shadow = c.prediction == SAPIPE_PREDICTION_SHADOW_STEP;
  const bool reads_local = shadow && c.estimate != SAPIPE_ESTIMATE_PREV_SYNC;
  for (size_t i = b.offset; i < b.offset + b.count; ++i)
    if (!std::isfinite(b.grad[i]) || (reads_local && !std::isfinite(b.local_grad[i]))) return false;
  const double lr = c.lr, wd = c.weight_decay, mu = c.momentum;
  for (size_t i = b.offset; i < b.offset + b.count; ++i) {
    const double w_old = b.weights[i];
    double w = w_old;
    const double a0 = static_cast<double>(b.grad[i]) * c.grad_scale;
    double ge = 0;
    if (shadow) {
      if (c.estimate == SAPIPE_ESTIMATE_LOCAL) ge = static_cast<double>(b.local_grad[i]) * c.local_grad_scale;
      else if (c.estimate == SAPIPE_ESTIMATE_PREV_SYNC) ge = a0;
      else {
        ge = c.have_prev_local ? a0 + (static_cast<double>(b.local_grad[i]) - b.prev_local_grad[i]) * c.local_grad_scale / c.world_size
                               : a0;
        b.prev_local_grad[i] = b.local_grad[i];
      }
    }
    double a = a0;
    if (c.compensation != SAPIPE_COMPENSATION_NONE) {
      a = compensate(c, a0, w, b.backup[i]);
      b.backup[i] = static_cast<float>(w_old);
    }
    double m = b.momentum ? b.momentum[i] : 0, v = b.second_moment ? b.second_moment[i] : 0;
    double d = 0;
    if (c.optimizer == SAPIPE_OPTIMIZER_SGD) {
      d = a + wd * w;
      if (mu == 0) {
        w -= lr * d;
      } else if (c.spike_delay >= 0) {
        const double A = std::pow(mu, c.spike_delay), B = (1 - A) / (1 - mu);
        m = (c.momentum_is_empty ? 0 : mu * m) + d;
        w -= lr * (A * m + B * d);
      } else {
        m = c.momentum_is_empty ? d : mu * m + (1 - c.dampening) * d;
        w -= lr * (c.nesterov ? d + mu * m : m);
      }
    } else {
      if (c.optimizer == SAPIPE_OPTIMIZER_ADAMW) w *= 1 - lr * wd;
      d = c.optimizer == SAPIPE_OPTIMIZER_ADAMW ? a : a + wd * w_old;
      m = c.beta1 * m + (1 - c.beta1) * d;
      v = c.beta2 * v + (1 - c.beta2) * d * d;
      w -= lr * adam_direction(c, m, v, c.step);
    }
    if (shadow) {
      if (c.compensate_estimate) ge = compensate(c, ge, w, w_old);
      double wh;
      if (c.optimizer == SAPIPE_OPTIMIZER_SGD) {
        const double ds = ge + wd * w;
        if (mu == 0) wh = w - lr * ds;
        else if (c.spike_delay >= 0) {
          const double A = std::pow(mu, c.spike_delay), B = (1 - A) / (1 - mu);
          wh = w - lr * (A * (mu * m + ds) + B * ds);
        } else {
          const double ms = mu * m + (1 - c.dampening) * ds;
          wh = w - lr * (c.nesterov ? ds + mu * ms : ms);
        }
      } else {
        const bool decoupled = c.optimizer == SAPIPE_OPTIMIZER_ADAMW;
        const double ds = decoupled ? ge : ge + wd * w;
        const double ms = c.beta1 * m + (1 - c.beta1) * ds, vs = c.beta2 * v + (1 - c.beta2) * ds * ds;
        wh = (decoupled ? w * (1 - lr * wd) : w) - lr * adam_direction(c, ms, vs, c.step + 1);
      }
      b.predicted[i] = static_cast<float>(wh);
    } else if (c.prediction == SAPIPE_PREDICTION_LINEAR) {
      const double s = c.prediction_steps;
      double wh;
      if (c.optimizer == SAPIPE_OPTIMIZER_SGD) wh = w - lr * s * (mu == 0 ? d : m);
      else {
        const double decay = c.optimizer == SAPIPE_OPTIMIZER_ADAMW ? std::pow(1 - lr * wd, s) : 1.0;
        wh = w * decay - lr * s * adam_direction(c, m, v, c.step);
      }
      b.predicted[i] = static_cast<float>(wh);
    }
    b.weights[i] = static_cast<float>(w);
    if (b.momentum && (c.optimizer != SAPIPE_OPTIMIZER_SGD || mu != 0)) b.momentum[i] = static_cast<float>(m);
    if (b.second_moment && c.optimizer != SAPIPE_OPTIMIZER_SGD) b.second_moment[i] = static_cast<float>(v);
  }
  return true;
}

}  // namespace sapipe::tests
