// lossfuse's CUDA emulator (tests/emu/include/cuda_runtime.h): device memory, streams, capture and graphs, the block
// scheduler, and the cuBLAS GEMM, in one shared library (liblfemu.so). Rules it enforces (docs/cuda.md#the-emulator):
// - device memory is mapped between guard pages and filled with 0xff bytes (NaN as a float) when allocated; a device
//   access past the guard pages' bounds stops the process with the allocation named, and a write into the slack next to
//   a buffer is found after the operation that made it;
// - copies and memsets must lie inside one allocation of the kind their direction names;
// - the threads of a block must meet at the same barrier, none having exited before it (the CUDA C++ guide forbids
//   it), and a warp's shuffle needs every lane its mask names;
// - memory a capture allocates is refilled with 0xff at every launch of a graph made from it (its contents are
//   undefined at each replay), so a replay that depends on an earlier one's leftovers shows it;
// - LFEMU_RACECHECK=1: each launch runs in two orders, with the bytes nothing has written yet (no kernel, copy or
//   memset) and every block's shared memory at 0xff in one run and 0x3f in the other: a differing result is a race
//   or a read of unwritten memory (run_launch);
// - in a thread under global capture mode, while a stream captures, synchronising calls fail and invalidate the capture
//   (CUDA's rule), and so does a copy between pageable host memory and a capturing stream.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace {
std::atomic<unsigned long long> next_id{1};
}  // namespace

struct CUstream_st {
  unsigned long long id = next_id++;
  bool capturing = false;
  bool invalidated = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  CUgraph_st* graph = nullptr;
};

// Allocations made or freed under a capture: kept until the graph and every exec made from it are gone.
struct GraphMemory {
  std::vector<void*> ptrs;
  std::vector<std::pair<void*, std::size_t>> made;  // allocated under the capture: refilled at each launch
  GraphMemory() = default;
  GraphMemory(const GraphMemory&) = delete;
  GraphMemory& operator=(const GraphMemory&) = delete;
  ~GraphMemory();
};

struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
  std::shared_ptr<GraphMemory> memory = std::make_shared<GraphMemory>();
};

struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
  std::shared_ptr<GraphMemory> memory;
};

struct CUmemPool_st {
  int device = 0;
};

struct CUevent_st {
  std::chrono::steady_clock::time_point at;
};

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace lfemu {

thread_local Builtins builtins;

namespace {

constexpr int kDevices = 2;
constexpr std::size_t kPage = 4096, kAlign = 256;
constexpr unsigned char kSlack = 0x7f, kFresh = 0xff;  // 0x7f...: a huge value in every float dtype a read adds
constexpr std::size_t kSharedLimit = 48 * 1024;        // a block's shared memory (static + dynamic) without opting in

std::mutex mu;  // memory map, streams, captures; a launch holds `launch_mu` instead
std::recursive_mutex launch_mu;
thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
std::atomic<int> global_captures{0};
CUstream_st legacy_stream;

void fail(const std::string& what) { std::fprintf(stderr, "lfemu: %s\n", what.c_str()); }

cudaError_t note(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// ---- device memory -------------------------------------------------------------------------------------------

struct Allocation {
  char* map;  // the mapping: guard page, slack, user bytes, slack, guard page
  std::size_t mapped;
  std::size_t bytes;  // what was asked
  int device;
  bool host;  // cudaHostAlloc: pinned host memory (no guard pages)
  // Under the race check (device memory): 1 per byte that nothing has written yet (an allocation's or a replay's
  // fill); `any_fresh` false: none is (the checks skip the buffer).
  std::vector<unsigned char> fresh = {};
  bool any_fresh = false;
};
std::map<std::uintptr_t, Allocation> allocations;  // by user pointer; under mu

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

// LFEMU_RACECHECK=1 (ctest sets it): each launch runs twice from the same device memory (run_launch), and the bytes
// nothing has written yet are tracked (Allocation::fresh) so that the two runs see them differently.
bool racecheck() {
  static const bool on = [] {
    const char* v = std::getenv("LFEMU_RACECHECK");
    return v != nullptr && std::strcmp(v, "0") != 0;
  }();
  return on;
}

char* user_of(const Allocation& a) {
  return a.host ? a.map : a.map + a.mapped - kPage - round_up(std::max<std::size_t>(a.bytes, 1), kAlign);
}

void* allocate(std::size_t bytes, bool host) {
  const std::lock_guard<std::recursive_mutex> launch(launch_mu);  // not between a race check's snapshots
  if (host) {
    void* p = std::malloc(std::max<std::size_t>(bytes, 1));
    if (p == nullptr) return nullptr;
    const std::lock_guard<std::mutex> lock(mu);
    allocations[reinterpret_cast<std::uintptr_t>(p)] = {static_cast<char*>(p), bytes, bytes, current_device, true};
    return p;
  }
  const std::size_t user = round_up(std::max<std::size_t>(bytes, 1), kAlign);
  const std::size_t body = round_up(user + kAlign, kPage);
  const std::size_t mapped = body + 2 * kPage;
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* map = static_cast<char*>(m);
  mprotect(map, kPage, PROT_NONE);
  mprotect(map + mapped - kPage, kPage, PROT_NONE);
  Allocation a{map, mapped, bytes, current_device, false};
  if (racecheck()) a.fresh.assign(bytes, 1), a.any_fresh = bytes != 0;
  char* p = user_of(a);
  std::memset(map + kPage, kSlack, static_cast<std::size_t>(p - map - kPage));
  std::memset(p, kFresh, bytes);
  std::memset(p + bytes, kSlack, static_cast<std::size_t>(map + mapped - kPage - p) - bytes);
  const std::lock_guard<std::mutex> lock(mu);
  allocations[reinterpret_cast<std::uintptr_t>(p)] = std::move(a);
  return p;
}

// Whether the slack bytes around a device allocation are as written.
bool slack_intact(const Allocation& a) {
  if (a.host) return true;
  const char* p = user_of(a);
  const auto untouched = [](const char* b, const char* e) {
    for (; b < e; ++b) {
      if (static_cast<unsigned char>(*b) != kSlack) return false;
    }
    return true;
  };
  return untouched(a.map + kPage, p) && untouched(p + a.bytes, p + round_up(std::max<std::size_t>(a.bytes, 1), kAlign));
}

// A write past a device buffer (into its slack) since the last check: an illegal address, as the device would report.
cudaError_t check_slack(const char* after) {
  const std::lock_guard<std::mutex> lock(mu);
  for (const auto& [p, a] : allocations) {
    if (!slack_intact(a)) {
      fail(std::string("out-of-bounds write next to the device allocation of ") + std::to_string(a.bytes) +
           " bytes at " + std::to_string(p) + ", found after " + after);
      return cudaErrorIllegalAddress;
    }
  }
  return cudaSuccess;
}

// The allocation holding [p, p + bytes) (nullptr: none holds it whole): within its bytes, or with `slack` within
// its 256-byte rounding too (the pointer attributes' extent, as the device's).
const Allocation* find(const void* p, std::size_t bytes, bool slack = false) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations.upper_bound(u);
  if (it == allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  const std::uintptr_t end = it->first + (a.host || !slack ? a.bytes : round_up(std::max<std::size_t>(a.bytes, 1), kAlign));
  return u + bytes <= end && u >= it->first ? &a : nullptr;
}

// [p, p + bytes) of device memory is now written (fresh 0) or holds a fill again (1), where the race check tracks it;
// `from`: a device-to-device copy's source, whose bytes' state the copy carries.
void mark(const void* p, std::size_t bytes, unsigned char fresh, const void* from = nullptr) {
  if (!racecheck() || bytes == 0) return;
  const std::lock_guard<std::mutex> lock(mu);
  auto* a = const_cast<Allocation*>(find(p, bytes));
  if (a == nullptr || a->fresh.empty()) return;
  unsigned char* f = a->fresh.data() + (static_cast<const char*>(p) - user_of(*a));
  const Allocation* s = from != nullptr ? find(from, bytes) : nullptr;
  if (s != nullptr && !s->fresh.empty()) {
    std::memmove(f, s->fresh.data() + (static_cast<const char*>(from) - user_of(*s)), bytes);
    a->any_fresh = a->any_fresh || s->any_fresh;
  } else {
    std::memset(f, fresh, bytes);
    a->any_fresh = a->any_fresh || fresh != 0;
  }
}

cudaError_t release(void* p, bool host) {
  if (p == nullptr) return cudaSuccess;
  const std::lock_guard<std::recursive_mutex> launch(launch_mu);  // not while a launch's race check restores memory
  Allocation a{};
  {
    const std::lock_guard<std::mutex> lock(mu);
    auto it = allocations.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == allocations.end() || it->second.host != host) return cudaErrorInvalidValue;
    a = std::move(it->second);
    allocations.erase(it);
  }
  if (host) {
    std::free(p);
    return cudaSuccess;
  }
  const bool intact = slack_intact(a);
  munmap(a.map, a.mapped);
  if (!intact) {
    fail("out-of-bounds write next to a device allocation of " + std::to_string(a.bytes) + " bytes, found at its free");
    return cudaErrorIllegalAddress;
  }
  return cudaSuccess;
}

// A device access into a guard page: named, then the process stops (the device would have lost its context).
void on_fault(int sig, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (const auto& [p, a] : allocations) {  // no lock: the process is stopping
    const auto m = reinterpret_cast<std::uintptr_t>(a.map);
    if (!a.host && addr >= m && addr < m + a.mapped) {
      char msg[200];
      const int n = std::snprintf(msg, sizeof msg,
                                  "lfemu: out-of-bounds device access at offset %lld of an allocation of %zu bytes\n",
                                  static_cast<long long>(addr) - static_cast<long long>(p), a.bytes);
      if (n > 0) (void)!write(2, msg, static_cast<std::size_t>(n));
      break;
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

struct FaultHandler {
  FaultHandler() {
    static char alt[1 << 16];
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
  }
} fault_handler;

// ---- streams and capture -------------------------------------------------------------------------------------

CUstream_st* of(cudaStream_t s) { return s == nullptr ? &legacy_stream : s; }

std::vector<CUstream_st*> capturing_streams;  // under mu

cudaError_t refuse_unsafe() {
  const std::lock_guard<std::mutex> lock(mu);
  for (CUstream_st* s : capturing_streams) s->invalidated = true;
  return note(cudaErrorStreamCaptureUnsupported);
}

// A potentially unsafe call (one that may synchronise) from this thread: refused while a global-mode capture runs,
// unless this thread is in relaxed mode; the captures are invalidated, as CUDA does.
bool unsafe_refused() { return thread_mode != cudaStreamCaptureModeRelaxed && global_captures.load() > 0; }

// Runs `op` on stream s now, or records it into s's capture.
cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
  CUstream_st* st = of(s);
  if (st->capturing) {
    if (st->invalidated) return note(cudaErrorStreamCaptureInvalidated);
    st->graph->nodes.push_back(std::move(op));
    return cudaSuccess;
  }
  op();
  return cudaSuccess;
}

// A kernel's fault (a barrier mismatch, a deadlock), reported by the stream's next synchronising call.
thread_local cudaError_t kernel_error = cudaSuccess;

cudaError_t pending() {
  if (kernel_error != cudaSuccess) {
    const cudaError_t e = kernel_error;
    kernel_error = cudaSuccess;
    return note(e);
  }
  return cudaSuccess;
}

// ---- the block scheduler -------------------------------------------------------------------------------------

enum class State { runnable, at_block, at_warp, done };

struct Fiber {
  void* sp = nullptr;
  State state = State::runnable;
  const void* site = nullptr;
  int predicate = 0;
  unsigned mask = 0;
  unsigned src = 0;             // at a warp exchange: the lane it reads
  const char* wfile = nullptr;  // and its source line
  int wline = 0;
  uint3 idx{};
};

constexpr std::size_t kStack = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;

struct Block {
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;
  void* scheduler_sp = nullptr;
  unsigned current = 0;
  Launch::Task* task = nullptr;
  unsigned char slots[kMaxThreads][16];
  int barrier_result = 0;
  std::vector<unsigned char> dynamic;
  unsigned char fill = 0;            // this block's run's fill of unwritten shared memory
  std::vector<const void*> statics;  // the static shared arrays this block has filled (static_shared)
  std::size_t static_bytes = 0;      // their bytes
  std::size_t dynamic_bytes = 0;     // the launch's dynamic shared memory
};
Block* block = nullptr;  // the running launch's (under launch_mu)

#if defined(__x86_64__)
extern "C" void lfemu_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.globl lfemu_switch
.hidden lfemu_switch
.type lfemu_switch,@function
lfemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size lfemu_switch, .-lfemu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#else
#error "lfemu's fibers are written for x86-64"
#endif

[[noreturn]] void fiber_entry() {
  Block& b = *block;
  b.task->run();
  Fiber& f = b.fibers[b.current];
  f.state = State::done;
  lfemu_switch(&f.sp, b.scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

void* fresh_stack(char* stack) {
  auto top = reinterpret_cast<std::uintptr_t>(stack + kStack) & ~std::uintptr_t{15};
  auto* sp = reinterpret_cast<std::uintptr_t*>(top);
  *--sp = 0;                                               // fiber_entry's (absent) return address
  *--sp = reinterpret_cast<std::uintptr_t>(&fiber_entry);  // lfemu_switch returns into it
  for (int i = 0; i < 6; ++i) *--sp = 0;                   // rbp, rbx, r12-r15
  return sp;
}

void yield(State s) {
  Block& b = *block;
  Fiber& f = b.fibers[b.current];
  f.state = s;
  lfemu_switch(&f.sp, b.scheduler_sp);
}

std::string describe_block() {
  const uint3 bi = builtins.block;
  return "block (" + std::to_string(bi.x) + ", " + std::to_string(bi.y) + ", " + std::to_string(bi.z) + ")";
}

std::uint64_t order_state = 0;  // under launch_mu: run_blocks seeds it
bool order_flipped = false;     // under launch_mu: run_blocks sets it

// Runs one block to its end; false (and kernel_error set, the reason printed) when its threads cannot go on.
bool run_block(Block& b, unsigned n) {
  b.fibers.assign(n, Fiber{});
  const dim3 bd = builtins.block_dim;
  for (unsigned t = 0; t < n; ++t) {
    b.fibers[t].sp = fresh_stack(b.stacks[t]);
    b.fibers[t].idx = {t % bd.x, (t / bd.x) % bd.y, t / (bd.x * bd.y)};
  }
  const unsigned warps = (n + 31) / 32;
  for (;;) {
    bool ran = false;
    // Each pass resumes the runnable threads from a pseudo-random start, forwards or backwards (fixed seed: the same
    // order on every run), so a missing barrier shows whichever thread order it depends on.
    order_state = order_state * 6364136223846793005ull + 1442695040888963407ull;
    const unsigned start = static_cast<unsigned>(order_state >> 33) % n;
    const bool backwards = (order_state >> 32 & 1u) != 0;
    for (unsigned k = 0; k < n; ++k) {
      const unsigned j = order_flipped ? n - 1 - k : k;  // the race check's first run: each pass exactly reversed
      const unsigned t = backwards ? (start + n - j) % n : (start + j) % n;
      if (b.fibers[t].state != State::runnable) continue;
      b.current = t;
      builtins.thread = b.fibers[t].idx;
      lfemu_switch(&b.scheduler_sp, b.fibers[t].sp);
      ran = true;
    }
    // Block barrier: every live thread there, at one site.
    unsigned live = 0, at_block = 0, exited = 0;
    const void* site = nullptr;
    bool mixed = false;
    int any = 0;
    for (const Fiber& f : b.fibers) {
      if (f.state == State::done) {
        ++exited;
        continue;
      }
      ++live;
      if (f.state == State::at_block) {
        ++at_block;
        if (site == nullptr) site = f.site;
        mixed = mixed || std::strcmp(static_cast<const char*>(site), static_cast<const char*>(f.site)) != 0;
        any |= f.predicate != 0;
      }
    }
    if (live == 0) return true;
    if (mixed) {
      std::string sites;
      for (const Fiber& f : b.fibers) {
        if (f.state == State::at_block && sites.find(static_cast<const char*>(f.site)) == std::string::npos) {
          sites += std::string(" ") + static_cast<const char*>(f.site);
        }
      }
      fail("the threads of " + describe_block() + " wait at different __syncthreads:" + sites);
      kernel_error = cudaErrorLaunchFailure;
      return false;
    }
    bool released = false;
    if (at_block == live && exited > 0) {
      fail("a __syncthreads in " + describe_block() + " (" + static_cast<const char*>(site) + ") is reached after " +
           std::to_string(exited) + " of its threads exited (the CUDA C++ guide forbids it)");
      kernel_error = cudaErrorLaunchFailure;
      return false;
    }
    if (at_block == live) {
      b.barrier_result = any;
      for (Fiber& f : b.fibers) {
        if (f.state == State::at_block) f.state = State::runnable;
      }
      released = true;
    }
    // Warp barriers: every lane of the mask there.
    for (unsigned w = 0; w < warps; ++w) {
      bool waiting = false, ready = true;
      unsigned mask = 0, first_lane = 0;
      for (unsigned l = 0; l < 32 && w * 32 + l < n; ++l) {
        const Fiber& f = b.fibers[w * 32 + l];
        if (f.state != State::at_warp) continue;
        const Fiber& first = b.fibers[w * 32 + first_lane];
        if (waiting && f.mask != mask) {
          fail("lanes of warp " + std::to_string(w) + " in " + describe_block() +
               " shuffle under different masks (the emulator takes one mask a warp)");
          kernel_error = cudaErrorLaunchFailure;
          return false;
        }
        if (waiting && (f.wline != first.wline || std::strcmp(f.wfile, first.wfile) != 0)) {
          fail("lanes of warp " + std::to_string(w) + " in " + describe_block() + " meet at different shuffles: " +
               first.wfile + ":" + std::to_string(first.wline) + " and " + f.wfile + ":" + std::to_string(f.wline));
          kernel_error = cudaErrorLaunchFailure;
          return false;
        }
        if ((f.mask >> l & 1u) == 0 || (f.mask >> f.src & 1u) == 0) {
          fail("lane " + std::to_string(l) + " of warp " + std::to_string(w) + " in " + describe_block() +
               " shuffles under mask " + std::to_string(f.mask) + ", which lacks " +
               ((f.mask >> l & 1u) == 0 ? "the lane itself" : "its source lane " + std::to_string(f.src)) + " (" +
               f.wfile + ":" + std::to_string(f.wline) + ")");
          kernel_error = cudaErrorLaunchFailure;
          return false;
        }
        if (!waiting) first_lane = l;
        waiting = true, mask = f.mask;
      }
      if (!waiting) continue;
      for (unsigned l = 0; l < 32; ++l) {
        if ((mask >> l & 1u) == 0) continue;
        if (w * 32 + l >= n || b.fibers[w * 32 + l].state == State::done) {
          fail("a warp shuffle in " + describe_block() + " names lane " + std::to_string(l) + " of warp " +
               std::to_string(w) + ", which has exited or does not exist");
          kernel_error = cudaErrorLaunchFailure;
          return false;
        }
        ready = ready && b.fibers[w * 32 + l].state == State::at_warp;
      }
      if (!ready) continue;
      for (unsigned l = 0; l < 32 && w * 32 + l < n; ++l) {
        if (b.fibers[w * 32 + l].state == State::at_warp) b.fibers[w * 32 + l].state = State::runnable;
      }
      released = true;
    }
    if (!ran && !released) {
      fail("the threads of " + describe_block() +
           " cannot go on: some wait at a __syncthreads, others at a warp "
           "shuffle");
      kernel_error = cudaErrorLaunchFailure;
      return false;
    }
  }
}

// Every block of one launch, in block order or its reverse, each pass over a block's threads seeded from `seed`.
// reverse: the blocks in reverse order, and each pass of a block's threads in the reverse of the order it has otherwise
// (the same seed), so that every two threads racing in one pass run in both orders across the race check's two runs.
// Dynamic and static shared memory start each block as `fill` bytes (static: at its declaration, static_shared).
void run_blocks(Block& b, dim3 grid, unsigned n, bool reverse, std::uint64_t seed, unsigned char fill = kFresh) {
  order_flipped = reverse;
  const unsigned long long total = 1ull * grid.x * grid.y * grid.z;
  for (unsigned long long k = 0; k < total; ++k) {
    const unsigned long long i = reverse ? total - 1 - k : k;
    builtins.block = {static_cast<unsigned>(i % grid.x), static_cast<unsigned>(i / grid.x % grid.y),
                      static_cast<unsigned>(i / (1ull * grid.x * grid.y))};
    order_state = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));  // per block, so both runs give block i the same passes
    std::fill(b.dynamic.begin(), b.dynamic.end(), fill);
    b.fill = fill;
    b.statics.clear();
    b.static_bytes = 0;
    if (!run_block(b, n)) return;
  }
}

// The user bytes of every device allocation (the race check's before and after).
using Snapshot = std::vector<std::pair<std::uintptr_t, std::vector<char>>>;
Snapshot snapshot() {
  const std::lock_guard<std::mutex> lock(mu);
  Snapshot v;
  for (const auto& [p, a] : allocations) {
    if (!a.host) v.emplace_back(p, std::vector<char>(reinterpret_cast<char*>(p), reinterpret_cast<char*>(p) + a.bytes));
  }
  return v;
}
void restore(const Snapshot& v) {
  for (const auto& [p, bytes] : v) std::memcpy(reinterpret_cast<char*>(p), bytes.data(), bytes.size());
}

// The race check's second fill of what nothing has written: finite and plausible in every float dtype (0.75 as a float,
// 1.8 as a half), where kFresh is NaN, so that a result computed from such bytes differs between the two runs.
constexpr unsigned char kFreshAlt = 0x3f;

// Fresh bytes no longer holding kFresh were written by a path that does not mark (the host through a pointer): written.
// Under mu.
void settle_fresh() {
  for (auto& [p, a] : allocations) {
    if (!a.any_fresh) continue;
    const auto* m = reinterpret_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < a.bytes; ++i) {
      if (a.fresh[i] != 0 && m[i] != kFresh) a.fresh[i] = 0;
    }
  }
}

// Every fresh byte set to `fill`. Under mu.
void fill_fresh(unsigned char fill) {
  for (auto& [p, a] : allocations) {
    if (!a.any_fresh) continue;
    auto* m = reinterpret_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < a.bytes; ++i) {
      if (a.fresh[i] != 0) m[i] = fill;
    }
  }
}

// A byte the race check's two runs left different, or none (byte < 0).
struct Mismatch {
  std::size_t alloc = 0;
  long long byte = -1;
};

// Compares the race check's runs: `first` (device memory at kFresh where fresh, shared memory kFresh) and
// `second` (kFreshAlt), the latter in memory now. A fresh byte holding kFresh then kFreshAlt was not written: it is
// set back to kFresh and stays fresh; one holding the same value in both was written; any other difference is the
// first mismatch returned. Under mu.
Mismatch compare_runs(const Snapshot& first, const Snapshot& second) {
  for (std::size_t i = 0; i < first.size(); ++i) {
    const auto& x = first[i].second;
    const auto& y = second[i].second;
    Allocation& a = allocations.at(second[i].first);
    auto* m = reinterpret_cast<unsigned char*>(second[i].first);
    const bool tracked = a.any_fresh;
    bool any = false;
    for (std::size_t j = 0; tracked && j < x.size(); ++j) {
      if (a.fresh[j] == 0) continue;
      const auto u = static_cast<unsigned char>(x[j]), v = static_cast<unsigned char>(y[j]);
      if (u == kFresh && v == kFreshAlt) {
        m[j] = kFresh, any = true;
      } else if (u == v) {
        a.fresh[j] = 0;
      } else {
        return {i, static_cast<long long>(j)};
      }
    }
    a.any_fresh = any;
    for (auto d = std::mismatch(x.begin(), x.end(), y.begin(), y.end()); d.first != x.end();
         d = std::mismatch(d.first + 1, x.end(), d.second + 1, y.end())) {
      const auto j = static_cast<std::size_t>(d.first - x.begin());
      if (!tracked || a.fresh[j] == 0) return {i, static_cast<long long>(j)};
    }
  }
  return {};
}

// LFEMU_RACECHECK=1: each launch runs twice from the same device memory, first with its blocks in reverse order and its
// threads in another order, then as usual (whose memory stays), with what nothing has written (fresh device bytes,
// shared memory) as kFresh in the first run and kFreshAlt in the second. A byte that differs between the two is
// a race (a missing __syncthreads, a block reading another's output) or a result computed from unwritten memory; a
// third run, in the usual order from kFresh, tells which. This project's kernels have no floating-point atomics, so
// their results never depend on the order.
void run_launch(dim3 grid, dim3 blk, std::size_t smem, Launch::Task* task) {
  const std::lock_guard<std::recursive_mutex> lock(launch_mu);
  const cudaError_t earlier = kernel_error;  // an earlier launch's, not yet reported: this one still runs in full
  kernel_error = cudaSuccess;
  static Block b;
  const unsigned n = blk.x * blk.y * blk.z;
  while (b.stacks.size() < n) {
    // a guard page below each stack: an overflow faults instead of running into the next fiber's
    void* s = mmap(nullptr, kStack + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) std::abort();
    mprotect(s, kPage, PROT_NONE);
    b.stacks.push_back(static_cast<char*>(s) + kPage);
  }
  b.task = task;
  b.dynamic.assign(smem + 16, kFresh);
  b.dynamic_bytes = smem;
  Block* const outer = block;
  block = &b;
  const Builtins saved = builtins;
  builtins.grid_dim = grid;
  builtins.block_dim = blk;
  static std::uint64_t launches = 0;
  const std::uint64_t seed = 0x853c49e6748fea9bull + 0x9e3779b97f4a7c15ull * ++launches;
  if (racecheck()) {
    {
      const std::lock_guard<std::mutex> m(mu);
      settle_fresh();
    }
    const Snapshot before = snapshot();
    run_blocks(b, grid, n, true, seed);
    const Snapshot first = snapshot();
    restore(before);
    {
      const std::lock_guard<std::mutex> m(mu);
      fill_fresh(kFreshAlt);
    }
    if (kernel_error == cudaSuccess) run_blocks(b, grid, n, false, seed, kFreshAlt);
    const Snapshot second = snapshot();
    Mismatch d;
    if (kernel_error == cudaSuccess) {
      const std::lock_guard<std::mutex> m(mu);
      d = compare_runs(first, second);
    }
    if (d.byte >= 0) {
      restore(before);
      run_blocks(b, grid, n, false, seed);
      const Snapshot third = snapshot();
      const auto j = static_cast<std::size_t>(d.byte);
      const bool order = third[d.alloc].second[j] != first[d.alloc].second[j];
      fail("a launch of " + std::to_string(1ull * grid.x * grid.y * grid.z) + " blocks of " + std::to_string(n) +
           " threads wrote different bytes " +
           (order ? "in two thread orders (a race)"
                  : "from two fills of memory nothing wrote (a result read from unwritten device or shared memory)") +
           ": byte " + std::to_string(j) + " of a device allocation of " +
           std::to_string(first[d.alloc].second.size()) + " bytes");
      kernel_error = cudaErrorLaunchFailure;
    }
  } else {
    run_blocks(b, grid, n, false, seed);
  }
  builtins = saved;
  block = outer;
  if (kernel_error == cudaSuccess) kernel_error = check_slack("a kernel");
  if (earlier != cudaSuccess) kernel_error = earlier;
}

}  // namespace

void sync_block(const void* site) { (void)sync_block_or(1, site); }

int sync_block_or(int predicate, const void* site) {
  Fiber& f = block->fibers[block->current];
  f.site = site;
  f.predicate = predicate;
  yield(State::at_block);
  return block->barrier_result;
}

void warp_exchange(unsigned mask, const void* mine, void* out, std::size_t bytes, unsigned src, const char* file,
                   int line) {
  Block& b = *block;
  const unsigned t = b.current, warp = t / 32;
  std::memcpy(b.slots[t], mine, bytes);
  Fiber& f = b.fibers[t];
  f.mask = mask, f.src = src, f.wfile = file, f.wline = line;
  yield(State::at_warp);
  f.src = t % 32;  // the second meeting reads nothing
  std::memcpy(out, b.slots[warp * 32 + src], bytes);
  yield(State::at_warp);
}

void* dynamic_shared() {
  auto p = reinterpret_cast<std::uintptr_t>(block->dynamic.data());
  return reinterpret_cast<void*>((p + 15) & ~std::uintptr_t{15});
}

void static_shared(void* p, std::size_t bytes) {
  Block& b = *block;
  if (std::find(b.statics.begin(), b.statics.end(), p) != b.statics.end()) return;
  b.statics.push_back(p);
  std::memset(p, b.fill, bytes);
  b.static_bytes += bytes;
  if (b.static_bytes + b.dynamic_bytes > kSharedLimit && kernel_error == cudaSuccess) {
    fail("a block's static shared memory (" + std::to_string(b.static_bytes) + " bytes reached so far) and dynamic (" +
         std::to_string(b.dynamic_bytes) + ") exceed the " + std::to_string(kSharedLimit) +
         " bytes a launch may use without opting in");
    kernel_error = cudaErrorLaunchFailure;
  }
}

std::atomic<std::uint64_t> kernels_asked{0}, memsets_asked{0}, copies_asked{0};

Counts counts() noexcept { return {kernels_asked.load(), memsets_asked.load(), copies_asked.load()}; }

void Launch::submit(Task* task) const {
  std::shared_ptr<Task> owned(task);
  ++kernels_asked;
  const unsigned long long threads = 1ull * block_.x * block_.y * block_.z;
  if (threads == 0 || threads > kMaxThreads || grid_.x == 0 || grid_.y == 0 || grid_.z == 0 || grid_.y > 65535 ||
      grid_.z > 65535 || smem_ > kSharedLimit) {
    note(cudaErrorInvalidConfiguration);
    return;
  }
  const dim3 g = grid_, bl = block_;
  const std::size_t smem = smem_;
  note(enqueue(stream_, [g, bl, smem, owned] { run_launch(g, bl, smem, owned.get()); }));
}

}  // namespace lfemu

using namespace lfemu;

GraphMemory::~GraphMemory() {
  for (void* p : ptrs) (void)release(p, false);
}

// ---- the runtime API ---------------------------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaGetLastError() {
  (void)pending();
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  (void)pending();
  return last_error;
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = kDevices;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= kDevices) return note(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrMultiProcessorCount) return note(cudaErrorInvalidValue);
  *value = 132;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= kDevices) return note(cudaErrorInvalidDevice);
  current_device = d;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (unsafe_refused()) return refuse_unsafe();
  return pending();
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (unsafe_refused()) return refuse_unsafe();
  *p = allocate(bytes, false);
  return *p == nullptr ? note(cudaErrorMemoryAllocation) : cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (unsafe_refused()) return refuse_unsafe();
  return note(release(p, false));
}
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) {
  if (unsafe_refused()) return refuse_unsafe();
  *p = allocate(bytes, true);
  return *p == nullptr ? note(cudaErrorMemoryAllocation) : cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void* p) {
  if (unsafe_refused()) return refuse_unsafe();
  return note(release(p, true));
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  const std::lock_guard<std::mutex> lock(mu);
  *a = {cudaMemoryTypeUnregistered, -1, nullptr, nullptr};
  if (const Allocation* al = find(p, 0, true); al != nullptr) {
    a->type = al->host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    a->device = al->device;
    a->devicePointer = al->host ? nullptr : const_cast<void*>(p);
    a->hostPointer = al->host ? const_cast<void*>(p) : nullptr;
  }
  return cudaSuccess;
}

namespace {

// Whether [p, p + bytes) lies in one device allocation (device) or outside every device allocation (host; pinned
// says whether inside a cudaHostAlloc one).
bool in_device(const void* p, std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(mu);
  const Allocation* a = find(p, bytes);
  return a != nullptr && !a->host;
}
bool pinned(const void* p, std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(mu);
  const Allocation* a = find(p, bytes);
  return a != nullptr && a->host;
}

cudaError_t copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s, bool async) {
  if (bytes == 0) return cudaSuccess;
  ++copies_asked;
  const std::lock_guard<std::recursive_mutex> launch(launch_mu);  // not while a launch's race check restores memory
  const bool dst_dev = in_device(dst, bytes), src_dev = in_device(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_dev && !in_device(src, 1); break;
    case cudaMemcpyDeviceToHost: ok = src_dev && !in_device(dst, 1); break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyHostToHost: ok = !in_device(dst, 1) && !in_device(src, 1); break;
    case cudaMemcpyDefault: ok = true; break;
  }
  if (!ok) {
    fail("a copy of " + std::to_string(bytes) + " bytes whose pointers do not lie in memory of the kinds it names");
    return note(cudaErrorInvalidValue);
  }
  if (!async && unsafe_refused()) return refuse_unsafe();
  if (of(s)->capturing) {
    const bool host_side = kind == cudaMemcpyHostToDevice ? true : kind == cudaMemcpyDeviceToHost;
    const void* host = kind == cudaMemcpyHostToDevice ? src : dst;
    if (host_side && !pinned(host, bytes)) {
      fail("a copy between pageable host memory and a capturing stream");
      return refuse_unsafe();
    }
  }
  const bool from_device = src_dev;
  const cudaError_t e = enqueue(s, [dst, src, bytes, from_device] {
    mark(dst, bytes, 0, from_device ? src : nullptr);
    std::memmove(dst, src, bytes);
  });
  if (e != cudaSuccess) return e;
  return async ? cudaSuccess : pending();
}

cudaError_t set(void* p, int value, std::size_t bytes, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  ++memsets_asked;
  const std::lock_guard<std::recursive_mutex> launch(launch_mu);
  if (!in_device(p, bytes)) {
    fail("a memset of " + std::to_string(bytes) + " bytes outside one device allocation");
    return note(cudaErrorInvalidValue);
  }
  return enqueue(s, [p, value, bytes] {
    mark(p, bytes, 0);
    std::memset(p, value, bytes);
  });
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return copy(dst, src, bytes, kind, nullptr, false);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  return copy(dst, src, bytes, kind, s, true);
}
cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (unsafe_refused()) return refuse_unsafe();
  return set(p, value, bytes, nullptr);
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) { return set(p, value, bytes, s); }

cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long* id) {
  if (s == cudaStreamPerThread) return note(cudaErrorInvalidResourceHandle);
  *id = of(s)->id;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return note(cudaErrorInvalidResourceHandle);
  if (s->capturing) return note(cudaErrorStreamCaptureUnsupported);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (of(s)->capturing) {
    fail("cudaStreamSynchronize on a capturing stream");
    const std::lock_guard<std::mutex> lock(mu);
    of(s)->invalidated = true;
    return note(cudaErrorStreamCaptureUnsupported);
  }
  if (unsafe_refused()) return refuse_unsafe();
  return pending();
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  const CUstream_st* st = of(s);
  *status = !st->capturing    ? cudaStreamCaptureStatusNone
            : st->invalidated ? cudaStreamCaptureStatusInvalidated
                              : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (s == nullptr || s->capturing) return note(cudaErrorInvalidValue);  // the legacy stream cannot capture
  const std::lock_guard<std::mutex> lock(mu);
  s->capturing = true;
  s->invalidated = false;
  s->mode = mode;
  s->graph = new CUgraph_st;
  capturing_streams.push_back(s);
  if (mode == cudaStreamCaptureModeGlobal) ++global_captures;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (s == nullptr || !s->capturing) return note(cudaErrorInvalidValue);
  std::unique_ptr<CUgraph_st> dropped;  // an invalidated capture's graph: deleted once mu is free (its memory's release
                                        // takes launch_mu, then mu)
  bool invalidated = false;
  {
    const std::lock_guard<std::mutex> lock(mu);
    s->capturing = false;
    capturing_streams.erase(std::find(capturing_streams.begin(), capturing_streams.end(), s));
    if (s->mode == cudaStreamCaptureModeGlobal) --global_captures;
    CUgraph_st* g = s->graph;
    s->graph = nullptr;
    *graph = s->invalidated ? nullptr : g;
    invalidated = s->invalidated;
    if (invalidated) dropped.reset(g);
  }
  return invalidated ? note(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  const cudaStreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return note(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes, graph->memory};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return note(cudaErrorInvalidValue);
  const cudaError_t fill = enqueue(s, [m = exec->memory] {  // the memory nodes: contents undefined at each replay
    for (const auto& [p, bytes] : m->made) {
      std::memset(p, kFresh, bytes);
      mark(p, bytes, 1);
    }
  });
  if (fill != cudaSuccess) return fill;
  for (const auto& node : exec->nodes) {
    const cudaError_t e = enqueue(s, node);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return note(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (unsafe_refused()) return refuse_unsafe();
  *pool = new CUmemPool_st{props->location.id};
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }

cudaError_t cudaMallocFromPoolAsync(void** p, std::size_t bytes, cudaMemPool_t, cudaStream_t s) {
  *p = allocate(bytes, false);
  if (*p == nullptr) return note(cudaErrorMemoryAllocation);
  if (of(s)->capturing) {  // the graph's until it goes
    of(s)->graph->memory->ptrs.push_back(*p);
    of(s)->graph->memory->made.emplace_back(*p, bytes);
  }
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s) {
  return cudaMallocFromPoolAsync(p, bytes, nullptr, s);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  CUstream_st* st = of(s);
  if (st->capturing) {
    auto& owned = st->graph->memory->ptrs;
    if (std::find(owned.begin(), owned.end(), p) == owned.end()) owned.push_back(p);
    return cudaSuccess;  // freed with the graph: a replay still uses it
  }
  return note(release(p, false));
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  return enqueue(s, [e] { e->at = std::chrono::steady_clock::now(); });
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return pending(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

// ---- cuBLAS ------------------------------------------------------------------------------------------------------

namespace {

double load(const void* p, cudaDataType_t t, std::int64_t i) {
  switch (t) {
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void store(void* p, cudaDataType_t t, std::int64_t i, double v) {
  switch (t) {
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; break;
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
    default: static_cast<float*>(p)[i] = static_cast<float>(v); break;
  }
}

std::size_t type_size(cudaDataType_t t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }

// The bytes a column-major operand of rows x cols at leading dimension ld spans.
std::size_t span(std::int64_t rows, std::int64_t cols, std::int64_t ld, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<std::size_t>((cols - 1) * ld + rows) * type_size(t);
}

// Column-major C = alpha op(A) op(B) + beta C, accumulated in Acc: op(A)'s rows and op(B)'s columns copied out
// first, so each entry is one contiguous dot product (four partial sums, combined in a fixed order).
template <class Acc>
void gemm_as(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const void* A,
             cudaDataType_t at, std::int64_t lda, const void* B, cudaDataType_t bt, std::int64_t ldb, double beta,
             void* C, cudaDataType_t ct, std::int64_t ldc) {
  std::vector<Acc> ar(static_cast<std::size_t>(m * k)), bc(static_cast<std::size_t>(n * k));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t l = 0; l < k; ++l) ar[i * k + l] = static_cast<Acc>(load(A, at, ta ? l + i * lda : i + l * lda));
  }
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t l = 0; l < k; ++l) bc[j * k + l] = static_cast<Acc>(load(B, bt, tb ? j + l * ldb : l + j * ldb));
  }
  const Acc al = static_cast<Acc>(alpha), be = static_cast<Acc>(beta);
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t i = 0; i < m; ++i) {
      const Acc* x = ar.data() + i * k;
      const Acc* y = bc.data() + j * k;
      Acc s[4] = {0, 0, 0, 0};
      std::int64_t l = 0;
      for (; l + 4 <= k; l += 4) {
        for (int q = 0; q < 4; ++q) s[q] += x[l + q] * y[l + q];
      }
      for (; l < k; ++l) s[0] += x[l] * y[l];
      const Acc dot = (s[0] + s[1]) + (s[2] + s[3]);
      const Acc prior = beta == 0 ? Acc(0) : static_cast<Acc>(load(C, ct, i + j * ldc));
      store(C, ct, i + j * ldc, static_cast<double>(al * dot + be * prior));
    }
  }
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx_64(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                               std::int64_t m, std::int64_t n, std::int64_t k, const void* alpha, const void* A,
                               cudaDataType_t Atype, std::int64_t lda, const void* B, cudaDataType_t Btype,
                               std::int64_t ldb, const void* beta, void* C, cudaDataType_t Ctype, std::int64_t ldc,
                               cublasComputeType_t compute, cublasGemmAlgo_t) {
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (m < 0 || n < 0 || k < 0 || lda < std::max<std::int64_t>(1, ta ? k : m) ||
      ldb < std::max<std::int64_t>(1, tb ? n : k) || ldc < std::max<std::int64_t>(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool f64 = compute == CUBLAS_COMPUTE_64F;
  const double a = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double b = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  const std::size_t sa = span(ta ? k : m, ta ? m : k, lda, Atype), sb = span(tb ? n : k, tb ? k : n, ldb, Btype),
                    sc = span(m, n, ldc, Ctype);
  if ((sa != 0 && !in_device(A, sa)) || (sb != 0 && !in_device(B, sb)) || (sc != 0 && !in_device(C, sc))) {
    fail("a cuBLAS GEMM operand outside one device allocation");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const cudaError_t e = enqueue(handle->stream, [=] {
    if (f64) {
      gemm_as<double>(ta, tb, m, n, k, a, A, Atype, lda, B, Btype, ldb, b, C, Ctype, ldc);
    } else {
      gemm_as<float>(ta, tb, m, n, k, a, A, Atype, lda, B, Btype, ldb, b, C, Ctype, ldc);
    }
    mark(C, sc, 0);
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

}  // extern "C"
