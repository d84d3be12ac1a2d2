// Environment switches the kernels read (host code, CPU and GPU builds alike).
#pragma once
#include <cstdlib>
#include <cstring>

namespace ja {

// Whether the environment variable `name` is set to "0": a path turned off, for A/B runs and tests.
// It is read on each call; callers that must not pay for getenv cache the answer themselves.
inline bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "0") == 0;
}

}  // namespace ja
