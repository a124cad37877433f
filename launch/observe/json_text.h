// JSON string literals for the files mpigrad writes by hand (the timeline, the benchmarks'
// --json): text that may hold quotes, backslashes or control characters (a path, a log line).
#pragma once

#include <string>
#include <string_view>

namespace mpigrad::launch {

// Appends `text` to `out` as a JSON string literal, quotes included: '"' and '\' escaped, control
// characters as \u00XX, everything else (UTF-8 included) as it is.
void append_json_string(std::string& out, std::string_view text);

}  // namespace mpigrad::launch
