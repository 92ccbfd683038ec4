// Reading typed fields from JS option objects, with ERR_INVALID_ARGUMENT naming the field.
#pragma once

#include <napi.h>

#include <string>

namespace sapipe::addon {

double get_number(const Napi::Object& obj, const char* key, double fallback);
bool get_bool(const Napi::Object& obj, const char* key, bool fallback);
Napi::Object expect_object(Napi::Env env, const Napi::Value& value, const char* what);
// A non-negative integer element count or offset (at most 2^53 - 1), from an option field.
size_t get_index(const Napi::Object& obj, const char* key, size_t fallback);

// The one way the addon reads a JS integer: x is finite, whole and in [lo, hi].
bool whole_in(double x, double lo, double hi);
// An integer argument in [lo, hi], else ERR_INVALID_ARGUMENT naming it.
double integer_arg(Napi::Env env, const Napi::Value& v, double lo, double hi, const char* what);
// A non-negative integer argument (count, offset, index) up to 2^53 - 1.
size_t index_arg(Napi::Env env, const Napi::Value& v, const char* what);

}  // namespace sapipe::addon
