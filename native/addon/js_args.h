// Reading typed fields from JS option objects, with ERR_INVALID_ARGUMENT naming the field.
#pragma once

#include <napi.h>

#include <string>

namespace sapipe::addon {

double get_number(const Napi::Object& obj, const char* key, double fallback);
bool get_bool(const Napi::Object& obj, const char* key, bool fallback);
Napi::Object expect_object(Napi::Env env, const Napi::Value& value, const char* what);
// A non-negative integer element count or offset.
size_t get_index(const Napi::Object& obj, const char* key, size_t fallback);

}  // namespace sapipe::addon
