/* A tiny check harness for the C API tests, which are C99 programs (no doctest): CHECK records a
 * failure with its line and goes on; CHECK_STATUS also prints mpigrad_last_error(). The test's
 * exit code is the number of failures (capped), so ctest sees any. */
#ifndef MPIGRAD_TEST_C_CHECK_H
#define MPIGRAD_TEST_C_CHECK_H

#include <mpigrad/mpigrad_c.h>
#include <stdio.h>
#include <string.h>

static int c_check_failures = 0;
static int c_check_count = 0;

#define CHECK(condition)                                                            \
  do {                                                                              \
    ++c_check_count;                                                                \
    if (!(condition)) {                                                             \
      ++c_check_failures;                                                           \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #condition); \
    }                                                                               \
  } while (0)

/* The call returns `expected`; on a mismatch prints both and the last error. */
#define CHECK_STATUS(call, expected)                                                               \
  do {                                                                                             \
    mpigrad_status status_ = (call);                                                               \
    ++c_check_count;                                                                               \
    if (status_ != (expected)) {                                                                   \
      ++c_check_failures;                                                                          \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, __LINE__, \
              #call, mpigrad_status_name(status_), #expected, mpigrad_last_error());               \
    }                                                                                              \
  } while (0)

/* The last error mentions `text`. */
#define CHECK_ERROR_MENTIONS(text)                                                             \
  do {                                                                                         \
    ++c_check_count;                                                                           \
    if (strstr(mpigrad_last_error(), (text)) == NULL) {                                        \
      ++c_check_failures;                                                                      \
      fprintf(stderr, "%s:%d: the last error does not mention '%s': %s\n", __FILE__, __LINE__, \
              (text), mpigrad_last_error());                                                   \
    }                                                                                          \
  } while (0)

static int c_check_exit_code(const char* name) {
  printf("%s: %d checks, %d failed\n", name, c_check_count, c_check_failures);
  return c_check_failures > 100 ? 100 : c_check_failures;
}

#endif
