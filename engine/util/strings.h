// Small string helpers shared by the engine's reports and messages.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace fact {

// The parts with `sep` between them: join({"a", "b"}, ", ") is "a, b".
inline std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// `v` in as many digits as read back to the same double; "inf", "-inf", "nan" where JSON has no
// number for it (Python's float() reads every form back).
inline std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace fact
