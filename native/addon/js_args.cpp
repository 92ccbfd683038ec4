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

size_t get_index(const Napi::Object& obj, const char* key, size_t fallback) {
  double d = get_number(obj, key, static_cast<double>(fallback));
  if (!std::isfinite(d) || d < 0 || std::floor(d) != d || d > 9007199254740991.0)
    throw_error(obj.Env(), "ERR_INVALID_ARGUMENT", std::string(key) + " must be a non-negative integer");
  return static_cast<size_t>(d);
}

}  // namespace sapipe::addon
