// error_message: what a test asserts about a core::Error, as text.
//
// Tests of bad input check the one error a user reads; error_message(call) runs the call and
// returns that error's message, or "" when the call throws none (so a CHECK of the text fails
// then too). Other exceptions propagate, and doctest reports them as failures.
#pragma once

#include <functional>
#include <string>

#include "mpigrad/core/error.h"

namespace mpigrad::test {

inline std::string error_message(const std::function<void()>& call) {
  try {
    call();
  } catch (const core::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace mpigrad::test
