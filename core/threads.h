// How many threads the CPU kernels and BLAS use, and where that number came from.
//
// The default is the cores this process may run on, divided among the processes of its node that
// may run on them too. The cores are its affinity mask (sched_getaffinity), not the machine's:
// taskset, mpirun --bind-to, Slurm and cgroups all hand a rank a subset, and a rank that starts
// a thread per core of the machine on one core of its own runs many times slower. Core alone
// knows only its own mask, so the CPU backend's first use applies the mask's count; the launch
// layer's DistributedManager, which learns from MPI which ranks share the node and what their
// masks are, then applies this rank's share (core_share). MPIGRAD_NUM_THREADS replaces either
// default. A program's own set_num_threads beats them all, before or after the backend's first
// use: a default never overrides an explicit choice.
//
// One pool of threads: OpenMP's. The BLAS library is set to 1 thread and called from mpigrad's
// own parallel regions (kernels/cpu/matmul.cpp cuts large products into a block per thread), so
// no second pool of BLAS workers busy-waits beside OpenMP's (docs/clusters.md, Threads).
//
// OpenMP's workers themselves busy-wait after every parallel region before they sleep: libgomp
// spins GOMP_SPINCOUNT times (300000 by default, milliseconds) unless OMP_WAIT_POLICY says
// otherwise, which burns the other cores of a node between regions and, where cores are shared
// with other processes, keeps the thread that has work off the core. libgomp reads both variables
// once, when it is loaded, before main: a setenv in the running program changes nothing. So
// programs call apply_openmp_wait_defaults(argv) first thing in main (the `mpigrad` program does);
// embedding codes set the variables in the job script.
//
// Debian's OpenBLAS 0.3.21 does not recognise some AVX-512 CPUs and falls back to its generic
// "Prescott" kernels, which makes sgemm about 6x slower. The first use of the CPU backend checks
// for that and prints one warning saying to set OPENBLAS_CORETYPE (the library reads it at load
// time, so it must be set before the program starts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mpigrad::core {

int num_threads();
// An explicit choice, for CPU kernels and the BLAS products they cut up alike (at least 1): no
// default replaces it.
void set_num_threads(int threads);

// The thread count and, for logs, where it came from ("set_num_threads", "MPIGRAD_NUM_THREADS",
// "2 cores in the affinity mask, shared by 2 ranks of the node").
struct ThreadChoice {
  int threads = 1;
  std::string source;
};

// The CPUs this process may run on (sched_getaffinity), ascending; 0 .. hardware_concurrency - 1
// where the mask cannot be read.
std::vector<int> affinity_cpus();
// This process's share of the cores in `mine` when `masks` are the affinity masks of the
// processes of its node (its own among them): each CPU of `mine` counts 1/n when n of the masks
// hold it. Disjoint masks (--bind-to core) give every core of `mine`; identical ones divide them.
double core_share(const std::vector<int>& mine, const std::vector<std::vector<int>>& masks);

// The default for `cores` cores (a share, floored, at least 1), with `source` saying where they
// came from; MPIGRAD_NUM_THREADS, when set, replaces it.
ThreadChoice default_thread_choice(double cores, const std::string& source);
// The default for a process alone on its affinity mask.
ThreadChoice default_thread_choice();
int default_num_threads();  // default_thread_choice().threads

// Applies a default unless set_num_threads was called; returns the choice in effect either way.
ThreadChoice apply_default_threads(const ThreadChoice& choice);
// The choice in effect: the last applied default, or the explicit one.
ThreadChoice thread_choice();

// The BLAS kernel family in use ("SkylakeX", "Haswell", "Prescott", or "unknown").
std::string blas_core_name();
// The warning text when BLAS runs a generic kernel on a CPU with AVX-512 or AVX2, else "".
std::string blas_core_warning();

// True in the launcher's rank 0 (Open MPI, MPICH/Hydra, Slurm), or in a process started without
// a launcher: the one process of a job that prints the once-per-job warnings of core, which runs
// before (or without) any communicator.
bool launcher_rank_zero();

// What OpenMP's idle workers do between parallel regions, chosen for a program that did not say
// (neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set). Spinning loses badly where cores are shared:
// on the 2-core development VM with load 8-9, ResNet-18 at 2 threads took 0.82-0.90 s a step
// with GOMP_SPINCOUNT=10000 against 0.09 s passive. On free cores a short spin wins, because
// oneDNN's convolutions run many short regions and a sleeping worker takes long to wake: idle VM,
// 2 threads, ResNet-18 42.5 ms passive against 31.1 ms with GOMP_SPINCOUNT=10000 (ResNet-50 128
// against 71 ms). So the default depends on whether the cores look free.
inline constexpr long kOpenMPShortSpin = 10000;  // GOMP_SPINCOUNT where cores are free
// How much other load (in runnable tasks) a node may carry beyond the cores our threads leave
// idle and still count as free: a load average is an average, and half a core of other work now
// and then costs a 10000-iteration spin (microseconds) little.
inline constexpr double kFreeCoreLoadSlack = 0.5;

// What the choice is made from: our own demand, the cores we may run on, and the other load.
struct NodeLoad {
  int threads_per_rank = 1;  // the OpenMP threads each rank of the node will run
  int ranks_on_node = 1;     // the job's processes on this node, this one among them
  int cpus = 1;              // CPUs in this process's affinity mask
  double load_average = -1;  // 1-minute load average (/proc/loadavg); negative: unknown
  int running_now = -1;      // runnable tasks now, ours among them; negative: unknown
  double busy_cpus = -1;     // CPUs' worth of time not idle while observed; negative: unknown
};

// An environment variable to set, and why, for logs.
struct OpenMPWaitChoice {
  std::string variable;  // "GOMP_SPINCOUNT" or "OMP_WAIT_POLICY"
  std::string value;     // "10000" or "passive"
  std::string reason;    // "2 threads x 1 rank on 2 CPUs, other load 0.1: cores free"
};

// The rule, a pure function. The demand is threads_per_rank x ranks_on_node threads; the other
// load is the 1-minute load average, but no more than the tasks runnable now less our own ranks
// (which are starting up, and are the only load left of a job that just ended before this one),
// and no more than the CPU time the node's CPUs actually spent busy while observed (a VM's load
// average can sit near 1 on idle CPUs).
// A short spin (kOpenMPShortSpin) when the demand fits the CPUs and the other load fits in what
// it leaves, give or take kFreeCoreLoadSlack; passive when the threads outnumber the CPUs, when
// the other load does not fit, or when the load cannot be read.
OpenMPWaitChoice choose_openmp_wait(const NodeLoad& node);

// The node as this process sees it before MPI starts: MPIGRAD_NUM_THREADS or the mask's share
// per rank, the launcher's local rank count (OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's
// MPI_LOCALNRANKS; 1 without a launcher), sched_getaffinity and /proc/loadavg (its runnable
// count read 5 times 10 ms apart, runnable_from_readings of them) and /proc/stat's busy time
// over those 40 ms.
NodeLoad observe_node_load();

// The runnable count to believe of several snapshots: their median, so neither one snapshot
// that catches a busy node idle nor one that catches an idle node in a kernel thread's instant
// decides. -1 (unknown) for none.
int runnable_from_readings(std::vector<int> readings);

// CPUs' worth of busy time between two /proc/stat readings (busy and total in clock ticks over
// `cpus` CPUs), within [0, cpus]; -1 (unknown) when the total did not advance. The busy count
// excludes this process's own time, read from /proc/self/stat at a different instant and
// rounding, so on an idle node it can go down between readings: that is no busy time, not a
// wrapped unsigned difference.
double busy_cpus_between(uint64_t busy_before, uint64_t total_before, uint64_t busy_after,
                         uint64_t total_after, int cpus);

// For a program's main, before anything else runs: when neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT is set, sets the variable choose_openmp_wait(observe_node_load()) names and
// executes the program again (/proc/self/exe, the same argv and environment, the same process id,
// so mpirun and Slurm see nothing), because the running OpenMP runtime has read its environment
// already. The reason goes along in MPIGRAD_OPENMP_WAIT, for openmp_wait_description. Returns
// without doing anything when either variable is set (as it is in the program executed again)
// or when each rank runs 1 thread, and carries on unchanged if the exec fails. A program run
// under valgrind should set the variable itself: valgrind does not follow the exec.
void apply_openmp_wait_defaults(char** argv);

// For the program's log: the wait setting in effect and where it came from ("GOMP_SPINCOUNT=10000
// (2 threads x 1 rank on 2 CPUs, other load 0.1: cores free)", "OMP_WAIT_POLICY=active (set by
// the user)", or the runtime's default when nothing was set).
std::string openmp_wait_description();

// The spin count OpenMP's runtime uses in this process, as it reports it (omp_display_env, read
// back by pointing stderr at a file for the call), or -1 if it does not say.
long openmp_spin_count();

// Applies the default thread count, unless one was already applied or chosen, and prints the
// BLAS warning once per process; idempotent. Called by the CPU backend on first use, so programs
// need not call it.
void initialize_cpu_runtime();

}  // namespace mpigrad::core
