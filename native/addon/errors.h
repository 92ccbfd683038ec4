// JS errors with a stable `code`. lib/errors.ts turns them into SapipeError subclasses.
#pragma once

#include <napi.h>

#include <string>

#include "sapipe/status.h"

namespace sapipe::addon {

[[noreturn]] void throw_error(Napi::Env env, const char* code, const std::string& message);
[[noreturn]] void throw_status(Napi::Env env, sapipe_status status, const std::string& what);
Napi::Error make_status_error(Napi::Env env, sapipe_status status, const std::string& what);

}  // namespace sapipe::addon
