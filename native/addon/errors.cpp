#include "errors.h"

namespace sapipe::addon {
namespace {

std::string explain(sapipe_status status) {
  switch (status) {
    case SAPIPE_ERR_INVALID_ARGUMENT: return "an argument is missing or out of range";
    case SAPIPE_ERR_SIZE_MISMATCH: return "buffer lengths do not match";
    case SAPIPE_ERR_ALIASING: return "two buffers that must be distinct are the same memory";
    case SAPIPE_ERR_DISPOSED: return "a buffer was used after dispose()";
    case SAPIPE_ERR_BUSY: return "a buffer is in use by a pending asynchronous operation; await it first";
    case SAPIPE_ERR_OUT_OF_MEMORY: return "out of memory";
    case SAPIPE_ERR_BACKEND_UNAVAILABLE: return "the backend is not available";
    case SAPIPE_ERR_PEER_LOST: return "a peer left or died; every rank must create a new communicator";
    case SAPIPE_ERR_TIMEOUT: return "peers did not take part within the timeout";
    default: return "internal error";
  }
}

}  // namespace

Napi::Error make_status_error(Napi::Env env, sapipe_status status, const std::string& what) {
  Napi::Error error = Napi::Error::New(env, what + ": " + explain(status));
  error.Set("code", Napi::String::New(env, sapipe_status_code(status)));
  return error;
}

void throw_error(Napi::Env env, const char* code, const std::string& message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, code));
  throw error;
}

void throw_status(Napi::Env env, sapipe_status status, const std::string& what) {
  throw make_status_error(env, status, what);
}

}  // namespace sapipe::addon
