// How a loss names its targets when one is out of range: the loss's op and what the targets are
// (a label field, for example), so the error can say "cross_entropy: label 12 at position 3 of
// label field 'y' is out of range for num_classes = 10". The backends raise it (core/backend.h);
// the public loss ops take it (core/ops/cross_entropy.h), which is why it has a header of its own.
#pragma once

#include <cstdint>
#include <string>

namespace mpigrad::core {

struct TargetCheck {
  std::string op = "cross_entropy";
  std::string targets;  // what they are, e.g. "label field 'y'"; "" when unknown
};

// "<op>: label <value> at position <position>[ of <targets>] is out of range for num_classes =
// <classes>".
std::string bad_target_message(const TargetCheck& check, int64_t position, int64_t value,
                               int64_t classes);

}  // namespace mpigrad::core
