// Running work in a child process, for library code that can crash or hang on hostile input.
//
// Debian's HDF5 1.10.8 can crash, or loop forever, while it decodes a corrupt file's metadata
// (fuzz/crashes/fuzz_hdf5/hdf5_*: found by fuzz_hdf5, each fault inside libhdf5). mpigrad
// cannot fix that library, so `mpigrad data inspect`, which decodes all of a file's structure,
// does that in a forked child: there a crash or a hang becomes one core::Error in the parent,
// naming the step the child was on. fork() without exec: the child may not use MPI, CUDA, or
// threads that the parent started. Call it before those exist; the data tool starts none.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace mpigrad::core {

// What the work can tell the parent while it runs: the step it is on, which the parent names
// in its error if the child dies there ("while reading attribute @units of a.h5").
class IsolatedProgress {
 public:
  explicit IsolatedProgress(int fd) : fd_(fd) {}
  void at(const std::string& step);

 private:
  int fd_;
};

// Runs `work` in a forked child and returns the string it returns. A core::Error the work throws
// is re-thrown here with the same message (a std::exception too, as a core::Error). A child that
// crashes, exits without a result, or gives none within `timeout` (it is then killed) makes this
// throw core::Error("<context> <what happened>, while <last step>"): `context` names the subject,
// as in "inspect: HDF5" -> "inspect: HDF5 crashed (signal 11, Segmentation fault), while ...".
std::string run_isolated(const std::function<std::string(IsolatedProgress&)>& work,
                         std::chrono::milliseconds timeout, const std::string& context);

// The child resets the crash signals (SIGSEGV, SIGABRT, ...) to their default action first, so
// a crash ends it at once instead of running the host's handlers.
//
// For the fuzz targets only: code to run in the child before the work and after it, and in the
// parent once the child has ended, and whether the child keeps the crash handlers (fuzz_hdf5
// keeps the sanitizers' handlers, whose reports it judges, drops libFuzzer's crash callback, and
// carries the child's coverage counters back). Null members are skipped.
struct IsolationHooks {
  void (*child_begin)() = nullptr;
  void (*child_end)() = nullptr;
  void (*parent_end)() = nullptr;
  bool keep_crash_handlers = false;
};
void set_isolation_hooks(const IsolationHooks& hooks);

}  // namespace mpigrad::core
