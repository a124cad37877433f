// Names and parsing for the communicator enums, and the environment-driven collective config.
#include "mpigrad/launch/comm/communicator.h"

#include <cstdlib>
#include <string>

#include "mpigrad/core/error.h"

namespace mpigrad::launch {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

Backend parse_backend(std::string_view text) {
  return core::parse_enum<Backend>(text, kBackendNames, "communication backend");
}

std::string_view backend_name(Backend backend) { return core::enum_name(backend, kBackendNames); }

CollectiveConfig CollectiveConfig::from_environment() {
  CollectiveConfig config;
  if (const char* text = std::getenv("MPIGRAD_COLLECTIVE_TIMEOUT"); text != nullptr && *text) {
    char* end = nullptr;
    double seconds = std::strtod(text, &end);
    MPIGRAD_CHECK(end != text && *end == '\0', "MPIGRAD_COLLECTIVE_TIMEOUT='", text,
                  "' is not a number of seconds");
    config.timeout_seconds = seconds;
  }
  if (const char* text = std::getenv("MPIGRAD_DEBUG_COLLECTIVES"); text != nullptr) {
    std::string_view value(text);
    config.debug_collectives = !(value.empty() || value == "0" || value == "false" || value == "off");
  }
  return config;
}

int simulated_node_count() {
  const char* text = std::getenv("MPIGRAD_SIMULATE_NODES");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long nodes = std::strtol(text, &end, 10);
  MPIGRAD_CHECK(end != text && *end == '\0' && nodes >= 1 && nodes <= 1 << 20,
                "MPIGRAD_SIMULATE_NODES='", text, "' is not a positive number of nodes");
  return int(nodes);
}

}  // namespace mpigrad::launch
