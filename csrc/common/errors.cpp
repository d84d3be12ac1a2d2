#include <cstdarg>
#include <cstdio>
#include <string>

#include "ja/api.h"

JA_API const char* ja_error(const char* fmt, ...) {
  thread_local std::string buffer;
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  buffer.assign(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(buffer.data(), size_t(n) + 1, fmt, ap2);
  va_end(ap2);
  return buffer.c_str();
}
