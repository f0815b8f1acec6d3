// Small string helpers shared by the engine's reports and messages.
#pragma once

#include <string>
#include <vector>

namespace fact {

// The parts with `sep` between them: join({"a", "b"}, ", ") is "a, b".
inline std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

}  // namespace fact
