#include "js_args.h"

#include <cmath>

#include "errors.h"

namespace sapipe::addon {

double get_number(const Napi::Object& obj, const char* key, double fallback) {
  Napi::Value v = obj.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsNumber()) throw_error(obj.Env(), "ERR_INVALID_ARGUMENT", std::string(key) + " must be a number");
  return v.As<Napi::Number>().DoubleValue();
}

bool get_bool(const Napi::Object& obj, const char* key, bool fallback) {
  Napi::Value v = obj.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsBoolean()) throw_error(obj.Env(), "ERR_INVALID_ARGUMENT", std::string(key) + " must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

Napi::Object expect_object(Napi::Env env, const Napi::Value& value, const char* what) {
  if (!value.IsObject()) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be an object");
  return value.As<Napi::Object>();
}

namespace {
constexpr double kMaxSafeInteger = 9007199254740991.0;  // 2^53 - 1
}  // namespace

bool whole_in(double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x <= hi && std::floor(x) == x; }

double integer_arg(Napi::Env env, const Napi::Value& v, double lo, double hi, const char* what) {
  if (!v.IsNumber() || !whole_in(v.As<Napi::Number>().DoubleValue(), lo, hi))
    throw_error(env, "ERR_INVALID_ARGUMENT",
                std::string(what) + " must be an integer in [" + std::to_string(static_cast<long long>(lo)) + ", " +
                    std::to_string(static_cast<long long>(hi)) + "]");
  return v.As<Napi::Number>().DoubleValue();
}

size_t index_arg(Napi::Env env, const Napi::Value& v, const char* what) {
  if (!v.IsNumber() || !whole_in(v.As<Napi::Number>().DoubleValue(), 0, kMaxSafeInteger))
    throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be a non-negative integer");
  return static_cast<size_t>(v.As<Napi::Number>().DoubleValue());
}

size_t get_index(const Napi::Object& obj, const char* key, size_t fallback) {
  double d = get_number(obj, key, static_cast<double>(fallback));
  if (!whole_in(d, 0, kMaxSafeInteger)) throw_error(obj.Env(), "ERR_INVALID_ARGUMENT", std::string(key) + " must be a non-negative integer");
  return static_cast<size_t>(d);
}

}  // namespace sapipe::addon
