// Enums with names: one table per enum, from which both parsing and printing follow.
//
// An enum that users spell in configs or on command lines (a backend, an optimizer, a loss)
// declares its names once, as an array of EnumName, next to the enum:
//     inline constexpr core::EnumName<Backend> kBackendNames[] = {
//         {Backend::Auto, "auto"}, {Backend::Mpi, "mpi"}, {Backend::Nccl, "nccl"}};
// parse_enum then accepts exactly those names, and an unknown one is an error that lists them
// all; enum_name prints the same spelling back, so a value always round-trips.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "mpigrad/core/error.h"

namespace mpigrad::core {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

// "auto | mpi | nccl": the accepted spellings, in table order.
template <typename E>
std::string enum_choices(std::span<const EnumName<E>> names) {
  std::string text;
  for (const auto& entry : names) {
    if (!text.empty()) text += " | ";
    text += entry.name;
  }
  return text;
}

// The value spelled `text`; otherwise core::Error "<what>: expected one of a | b, got 'text'".
template <typename E>
E parse_enum(std::string_view text, std::span<const EnumName<E>> names, std::string_view what) {
  for (const auto& entry : names) {
    if (entry.name == text) return entry.value;
  }
  fail(what, ": expected one of ", enum_choices(names), ", got '", text, "'");
}

// The spelling of `value`; "?" for a value missing from the table (a bug, never user input).
template <typename E>
std::string_view enum_name(E value, std::span<const EnumName<E>> names) {
  for (const auto& entry : names) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// The same for a table declared as an array (deduces E from it).
template <typename E, std::size_t N>
std::string enum_choices(const EnumName<E> (&names)[N]) {
  return enum_choices(std::span<const EnumName<E>>(names));
}
template <typename E, std::size_t N>
E parse_enum(std::string_view text, const EnumName<E> (&names)[N], std::string_view what) {
  return parse_enum(text, std::span<const EnumName<E>>(names), what);
}
template <typename E, std::size_t N>
std::string_view enum_name(E value, const EnumName<E> (&names)[N]) {
  return enum_name(value, std::span<const EnumName<E>>(names));
}

}  // namespace mpigrad::core
