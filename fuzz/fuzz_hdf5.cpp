// fuzz target fuzz_hdf5: the input is the bytes of one HDF5 file. It is opened in memory (HDF5's
// file-image API, core::hdf5::File::open_image: nothing is written to disk) and goes through
// what `mpigrad data inspect` runs (data::inspect_files) and through the dataset opener
// (data::Hdf5Dataset with the usual fields x and y), which then reads one small batch.
// core::Error is the expected outcome for a corrupt file; anything else (a crash, a hang,
// undefined behaviour, a leak, another exception) is a finding.
//
// inspect_files does its HDF5 work in a forked child (core/isolated.h), because HDF5 1.10.8 itself
// crashes on some files (fuzz/crashes/fuzz_hdf5/hdf5_*). Under libFuzzer the hooks below keep
// that child fuzzable: it carries its coverage counters back to the parent, and when it dies,
// its sanitizer report decides whose fault it was. A fault whose innermost frame is in libhdf5
// (a function named H5*) is HDF5's, and becomes the clean error inspect gives users; any other
// (mpigrad's code, a UBSan report, a hang outside HDF5) is printed and aborts the fuzzer, so it
// is found as if there were no child.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/hdf5_dataset.h"

#ifdef MPIGRAD_FUZZ_LIBFUZZER
#include <elf.h>
#include <link.h>
#include <sanitizer/common_interface_defs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "mpigrad/core/isolated.h"
#endif

namespace {

using namespace mpigrad;

// A batch is read only when it is small: a valid file may hold big samples, and reading them
// would measure the allocator, not the parser.
constexpr int64_t kMaxBatchBytes = int64_t(1) << 20;

// The child's time limit. Under libFuzzer a child still busy after kChildAlarmSeconds prints its
// stack and is judged; the rest is for symbolizing that stack. libFuzzer's -timeout is 10 s.
constexpr auto kChildTimeout = std::chrono::seconds(8);

#ifdef MPIGRAD_FUZZ_LIBFUZZER

// The inline 8-bit coverage counters of the whole (static) executable: clang puts them in the
// section __sancov_cntrs. Found from the section headers of /proc/self/exe plus the program's
// load address, because declaring the linker's __start___sancov_cntrs in an instrumented file
// makes clang rename its own reference, and libFuzzer then sees no counters at all.
uint8_t* g_counters = nullptr;

void find_counters(size_t* count) {
  std::ifstream exe("/proc/self/exe", std::ios::binary);
  Elf64_Ehdr header{};
  if (!exe.read(reinterpret_cast<char*>(&header), sizeof(header))) return;
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  exe.seekg(std::streamoff(header.e_shoff));
  if (sections.empty() || header.e_shstrndx >= sections.size() ||
      !exe.read(reinterpret_cast<char*>(sections.data()),
                std::streamsize(sections.size() * sizeof(Elf64_Shdr)))) {
    return;
  }
  std::string names(sections[header.e_shstrndx].sh_size, '\0');
  exe.seekg(std::streamoff(sections[header.e_shstrndx].sh_offset));
  if (!exe.read(names.data(), std::streamsize(names.size()))) return;
  uintptr_t load_address = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<uintptr_t*>(data) = info->dlpi_addr;  // the first object is the program
        return 1;
      },
      &load_address);
  for (const Elf64_Shdr& section : sections) {
    if (section.sh_name < names.size() &&
        std::strcmp(names.c_str() + section.sh_name, "__sancov_cntrs") == 0) {
      g_counters = reinterpret_cast<uint8_t*>(load_address + section.sh_addr);
      *count = section.sh_size;
    }
  }
}

constexpr unsigned kChildAlarmSeconds = 2;

// Shared between the fuzzer and its child (MAP_SHARED): the child's verdict, then its counters.
struct Shared {
  int finished;   // the work returned or threw: child_end ran
  int hdf5s;      // the child died inside libhdf5: inspect's clean error, not a finding
  int our_fault;  // the child died outside libhdf5: the parent aborts, a finding
  uint8_t* counters() { return reinterpret_cast<uint8_t*>(this + 1); }
};
Shared* g_shared = nullptr;
size_t g_counter_count = 0;
size_t g_hdf5_faults = 0;  // inputs whose inspect child died inside libhdf5, for the summary
int g_saved_stderr = -1;   // the fuzzer's stderr, in the child (its own stderr is a memfd)
int g_report_fd = -1;      // the child's stderr: what its sanitizers printed

std::string child_report() {
  std::string text;
  char chunk[4096];
  ::lseek(g_report_fd, 0, SEEK_SET);
  ssize_t got;
  while ((got = ::read(g_report_fd, chunk, sizeof(chunk))) > 0) text.append(chunk, size_t(got));
  return text;
}

// True when the report's first stack reaches libhdf5 before any code with a source location.
// Frames without one are the sanitizer runtime and its interceptors (strdup, memcpy, ...), libc
// and libstdc++: they are skipped, and so is this file (the alarm handler). mpigrad is built
// with -g, so a fault in its code, or in a library it called, meets an mpigrad frame first.
bool fault_is_hdf5s(const std::string& report) {
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line)) {
    // "    #3 0x7f12... in H5HG_read (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x..)" or
    // "    #4 0x55... in mpigrad::data::(anonymous namespace)::f(...)
    // /work/.../data_tool.cpp:380:7"
    std::istringstream words(line);
    std::string number, address;
    if (!(words >> number >> address) || number.size() < 2 || number[0] != '#' ||
        !address.starts_with("0x")) {
      continue;
    }
    if (line.find("libhdf5") != std::string::npos) return true;
    // The location is the text after the last "(" when there is no source file: "(module+0x..)".
    const bool has_source =
        line.find(".c:") != std::string::npos || line.find(".cpp:") != std::string::npos ||
        line.find(".h:") != std::string::npos || line.find(".cc:") != std::string::npos ||
        line.find(".tcc:") != std::string::npos || line.find(".hpp:") != std::string::npos;
    const bool bare_header = line.find("/include/c++/") != std::string::npos;  // <vector>, ...
    if (!has_source && !bare_header) continue;
    if (line.find("fuzz_hdf5.cpp") != std::string::npos) continue;
    return false;
  }
  return false;
}

// The child's end by a sanitizer report or its alarm: HDF5's fault ends it quietly (inspect
// then gives its error); ours is printed on the fuzzer's stderr and flagged for the parent.
[[noreturn]] void judge_child_and_exit() {
  const std::string report = child_report();
  if (fault_is_hdf5s(report)) {
    g_shared->hdf5s = 1;
  } else {
    g_shared->our_fault = 1;
    const std::string text = "fuzz_hdf5: the inspect child died outside libhdf5:\n" + report;
    if (::write(g_saved_stderr, text.data(), text.size()) < 0) {
      // nothing more to do: the parent aborts on our_fault either way
    }
  }
  ::_exit(70);
}

void on_child_alarm(int) {
  __sanitizer_print_stack_trace();
  judge_child_and_exit();
}

void child_begin() {
  g_saved_stderr = ::dup(2);
  g_report_fd = ::memfd_create("fuzz_hdf5_child_stderr", 0);
  if (g_report_fd >= 0) ::dup2(g_report_fd, 2);
  __sanitizer_set_death_callback(judge_child_and_exit);
  std::signal(SIGALRM, on_child_alarm);
  ::alarm(kChildAlarmSeconds);
}

void child_end() {
  ::alarm(0);
  g_shared->finished = 1;
  std::memcpy(g_shared->counters(), g_counters, g_counter_count);
}

void parent_end() {
  for (size_t i = 0; i < g_counter_count; ++i) {
    g_counters[i] = std::max(g_counters[i], g_shared->counters()[i]);
  }
  std::memset(g_shared->counters(), 0, g_counter_count);
  // A child neither finished nor judged was killed at kChildTimeout, or by a signal that no
  // sanitizer reported: nothing says the fault was HDF5's, so it counts as ours.
  const bool unjudged = !g_shared->finished && !g_shared->hdf5s && !g_shared->our_fault;
  if (g_shared->our_fault || unjudged) {
    std::fprintf(stderr, "fuzz_hdf5: aborting: the inspect child %s\n",
                 unjudged ? "ended without a verdict (killed at the timeout?)"
                          : "died in mpigrad's code (report above)");
    std::abort();
  }
  if (!g_shared->finished) ++g_hdf5_faults;
  g_shared->finished = g_shared->hdf5s = 0;
}

void install_isolation_hooks() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  find_counters(&g_counter_count);
  if (g_counters == nullptr || g_counter_count == 0) {
    std::fprintf(stderr, "fuzz_hdf5: no __sancov_cntrs section in /proc/self/exe\n");
    std::abort();
  }
  std::fprintf(stderr,
               "INFO: fuzz_hdf5: the inspect child's %zu coverage counters [%p, %p) come back\n",
               g_counter_count, static_cast<void*>(g_counters),
               static_cast<void*>(g_counters + g_counter_count));
  void* memory = ::mmap(nullptr, sizeof(Shared) + g_counter_count, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) std::abort();
  g_shared = static_cast<Shared*>(memory);
  core::IsolationHooks hooks;
  hooks.child_begin = child_begin;
  hooks.child_end = child_end;
  hooks.parent_end = parent_end;
  hooks.keep_crash_handlers = true;  // ASan's reports are what judge_child_and_exit reads
  core::set_isolation_hooks(hooks);
  std::atexit([] {
    std::fprintf(stderr,
                 "fuzz_hdf5: %zu inputs crashed or hung libhdf5 in the inspect child "
                 "(each a clean inspect error)\n",
                 g_hdf5_faults);
  });
}

#endif  // MPIGRAD_FUZZ_LIBFUZZER

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
#ifdef MPIGRAD_FUZZ_LIBFUZZER
  install_isolation_hooks();
#endif
  if (size == 0) return 0;
  auto open_image = [&](const std::string& name) {
    return core::hdf5::File::open_image(bytes, size, name);
  };
  std::ostringstream out;
  try {
    data::inspect_files({"fuzz.h5"}, {}, open_image, kChildTimeout, out);
  } catch (const core::Error&) {
  }
  try {
    data::Hdf5DatasetOptions options;
    options.open_file = open_image;
    data::Hdf5Dataset dataset({"fuzz.h5"}, options);
    out << dataset.describe();
    int64_t sample_bytes = 0;
    for (const data::FieldInfo& field : dataset.fields()) sample_bytes += field.sample_bytes();
    if (dataset.size() > 0 && sample_bytes <= kMaxBatchBytes / 2) {
      const std::vector<int64_t> indices = {dataset.size() - 1, 0};
      dataset.get_batch(indices);
    }
  } catch (const core::Error&) {
  }
  return 0;
}
