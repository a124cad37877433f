#include "mpigrad/launch/observe/json_text.h"

#include <cstdio>

namespace mpigrad::launch {

void append_json_string(std::string& out, std::string_view text) {
  out.push_back('"');
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", unsigned(static_cast<unsigned char>(c)));
      out.append(escaped);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

}  // namespace mpigrad::launch
