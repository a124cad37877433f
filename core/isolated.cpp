// run_isolated: fork, run the work in the child, read its frames from a pipe in the parent.
//
// The child writes frames of [kind: 1 byte][length: 8 bytes][payload]: 'P' for a progress step,
// then exactly one of 'R' (the result) or 'E' (an error message). A child that dies before its
// last frame is complete has crashed, whatever its exit status says (ASan exits with 1).
#include "mpigrad/core/isolated.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <exception>
#include <sstream>

#include "mpigrad/core/error.h"

namespace mpigrad::core {

namespace {

IsolationHooks g_hooks;

// Writes all of `size` bytes; false when the pipe is gone (the parent gave up on the child).
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    data += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

void write_frame(int fd, char kind, const std::string& payload) {
  char header[9];
  header[0] = kind;
  const uint64_t length = payload.size();
  std::memcpy(header + 1, &length, sizeof(length));
  if (write_all(fd, header, sizeof(header))) write_all(fd, payload.data(), payload.size());
}

[[noreturn]] void run_child(int fd, const std::function<std::string(IsolatedProgress&)>& work) {
  // A crash here is expected and reported by the parent: end the child at once, without the
  // host's crash handlers (a test framework's report, Open MPI's backtrace printer).
  if (!g_hooks.keep_crash_handlers) {
    for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) {
      std::signal(signal, SIG_DFL);
    }
  }
  if (g_hooks.child_begin) g_hooks.child_begin();
  char kind = 'R';
  std::string payload;
  try {
    IsolatedProgress progress(fd);
    payload = work(progress);
  } catch (const Error& error) {
    kind = 'E';
    payload = error.what();
  } catch (const std::exception& error) {
    kind = 'E';
    payload = std::string("unexpected error: ") + error.what();
  } catch (...) {
    kind = 'E';
    payload = "unexpected error (not a std::exception)";
  }
  if (g_hooks.child_end) g_hooks.child_end();
  write_frame(fd, kind, payload);
  ::close(fd);
  // _exit: no atexit handlers, no flush of stdio buffers copied from the parent, no leak check.
  ::_exit(0);
}

// How a child without a complete last frame ended, from its wait status.
std::string describe_end(bool waited, int status) {
  if (!waited) return "ended without a result";
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = ::strsignal(signal);
    return "crashed (signal " + std::to_string(signal) + ", " + (name ? name : "unknown") + ")";
  }
  if (WIFEXITED(status)) {
    return "crashed (it exited with status " + std::to_string(WEXITSTATUS(status)) +
           " before its result)";
  }
  return "ended without a result";
}

// Parses the complete frames at the front of `buffer` and removes them.
struct Frames {
  std::string last_step;
  bool done = false;
  char kind = 0;
  std::string payload;

  void take(std::string& buffer) {
    while (!done && buffer.size() >= 9) {
      uint64_t length = 0;
      std::memcpy(&length, buffer.data() + 1, sizeof(length));
      if (buffer.size() - 9 < length) return;
      const char frame_kind = buffer[0];
      std::string frame_payload = buffer.substr(9, length);
      buffer.erase(0, 9 + length);
      if (frame_kind == 'P') {
        last_step = std::move(frame_payload);
      } else {
        done = true;
        kind = frame_kind;
        payload = std::move(frame_payload);
      }
    }
  }
};

}  // namespace

void IsolatedProgress::at(const std::string& step) {
  write_frame(fd_, 'P', step);
}

void set_isolation_hooks(const IsolationHooks& hooks) {
  g_hooks = hooks;
}

std::string run_isolated(const std::function<std::string(IsolatedProgress&)>& work,
                         std::chrono::milliseconds timeout, const std::string& context) {
  int fds[2];
  MPIGRAD_CHECK(::pipe2(fds, O_CLOEXEC) == 0, context, ": pipe failed: ", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int saved = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail(context, ": fork failed: ", std::strerror(saved));
  }
  if (pid == 0) {
    ::close(fds[0]);
    run_child(fds[1], work);
  }
  ::close(fds[1]);

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Frames frames;
  std::string buffer;
  bool timed_out = false;
  char chunk[1 << 16];
  while (!frames.done) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd reader{fds[0], POLLIN, 0};
    const int ready =
        ::poll(&reader, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) break;
    if (ready == 0) continue;
    const ssize_t got = ::read(fds[0], chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // end of file: the child closed the pipe or died
    buffer.append(chunk, static_cast<size_t>(got));
    frames.take(buffer);
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  pid_t waited = -1;
  do {
    waited = ::waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  // A host program that ignores SIGCHLD has its children reaped for it: then there is no status.
  if (g_hooks.parent_end) g_hooks.parent_end();

  if (frames.done && frames.kind == 'R') return frames.payload;
  if (frames.done) throw Error(frames.payload);
  std::ostringstream what;
  if (timed_out) {
    what << "did not finish within " << timeout.count() / 1000.0 << " s (killed)";
  } else {
    what << describe_end(waited == pid, status);
  }
  fail(context, " ", what.str(), frames.last_step.empty() ? "" : ", while " + frames.last_step);
}

}  // namespace mpigrad::core
