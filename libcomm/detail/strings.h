// Small string helpers shared by the parsers of names and URLs.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace comm::detail {

inline std::string lowercase(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return lower;
}

}  // namespace comm::detail
