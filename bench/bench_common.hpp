// lossfuse bench: the shared base of `lossfuse bench`.
//
// What it measures: the median wall time of a loss kernel on deterministic inputs, turned into effective
// bandwidth (bytes the kernel must move / time) and compared, in the same run, with this machine's own
// streaming bandwidth at the same byte size (a multi-threaded read and a read+write copy over buffers as
// large as the kernel's input), and with a plain scalar baseline run on the same threads.
//
// Here: aligned first-touched buffers, deterministic inputs, median timing with adaptive repetitions,
// the bandwidth probes, the result rows with their table/CSV printing, and the registry through which each
// loss (bench/<loss>_bench.cpp) adds its entries. A loss registers a Suite with LOSSFUSE_BENCH_SUITE; the
// runner plans every suite's groups, then runs them with "[k/total]" progress on stderr.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lossfuse/dtype.hpp"

namespace lossfuse::bench {

// ---- buffers ------------------------------------------------------------------------------------------

// An owning byte buffer, 64-byte aligned (2 MiB and huge-page advised when large). Every page is touched
// in parallel by the OpenMP threads at construction (static schedule, zero fill), so no page fault or
// first-touch cost lands inside a timed region.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t bytes);

  [[nodiscard]] void* data() const noexcept { return ptr_.get(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(data());
  }

 private:
  struct Free {
    void operator()(void* p) const noexcept;
  };
  std::unique_ptr<void, Free> ptr_;
  std::size_t bytes_ = 0;
};

// ---- deterministic inputs -----------------------------------------------------------------------------

// Element i is a function of (seed, i) only: the same values for any thread count, and a bfloat16 buffer
// holds the rounded float32 values of the same seed. Filled in parallel. dtype: f32, f64 or bf16.
void fill_normal(void* data, DType dtype, std::int64_t count, double stddev, std::uint64_t seed);
// Uniform integers in [0, hi).
void fill_uniform_index(std::int64_t* data, std::int64_t count, std::int64_t hi, std::uint64_t seed);

// bfloat16 <-> float with scalar shifts (round to nearest even on the way down). Inline: the scalar baseline
// calls them per element.
inline float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}
inline std::uint16_t float_to_bf16(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((u >> 16) | 0x40);  // nan stays quiet nan
  }
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// "f32", "bf16", ...: the names the command line takes and prints.
std::string_view short_dtype_name(DType t) noexcept;
bool parse_dtype(std::string_view s, DType& out) noexcept;

// ---- timing -------------------------------------------------------------------------------------------

// How many timed calls: after `warmup` untimed calls, calls are timed until they add up to min_time_s, at
// least min_reps and at most max_reps of them; when the first timed call takes >= slow_call_s, min_reps_slow
// replaces min_reps (for the slow scalar baseline). fixed_reps > 0 overrides all of it.
struct RepPolicy {
  double min_time_s = 0.3;
  int min_reps = 3;
  int max_reps = 50;
  int warmup = 1;
  int fixed_reps = 0;
  double slow_call_s = 1e30;
  int min_reps_slow = 3;
};

struct Timing {
  double median_s = 0.0;
  int reps = 0;
};

// steady_clock around each call; returns the median.
Timing time_median(const std::function<void()>& fn, const RepPolicy& policy);

// The functions called in turn (a, b, a, b, ...) under one policy applied to a round, so each sees the same
// machine state (noisy neighbours, frequency): their median ratio is steadier than that of separate runs.
std::vector<Timing> time_interleaved(const std::vector<std::function<void()>>& fns, const RepPolicy& policy);

// ---- bandwidth probes ---------------------------------------------------------------------------------

// GB/s (1e9 bytes/s) at one byte size, on the OpenMP threads (as many as lossfuse uses):
//   read: every 64-bit word of src summed (bytes/time);
//   copy: src copied into dst with ordinary cached stores ((read + written bytes)/time).
// Buffers that fit in cache give cache bandwidth, which is the right yardstick for a kernel of that size.
struct Bandwidth {
  double read_gbps = 0.0;
  double copy_gbps = 0.0;
};
Bandwidth measure_bandwidth(const void* src, void* dst, std::size_t bytes, int threads, const RepPolicy& policy);

// One call of each probe, to be timed by the caller (e.g. interleaved with a kernel).
std::function<void()> read_probe(const void* src, std::size_t bytes, int threads);
std::function<void()> copy_probe(const void* src, void* dst, std::size_t bytes, int threads);

// ---- results ------------------------------------------------------------------------------------------

struct Row {
  std::string loss;                 // "cross_entropy"
  std::vector<std::int64_t> shape;  // printed "(4096, 32000)" in the table, "4096x32000" in the CSV
  std::string dtype;                // "f32"
  std::string direction;            // "forward", "fwd+bwd"
  double ms = 0.0;                  // lossfuse median
  double gbps = 0.0;                // effective bytes / median time
  double probe_gbps = 0.0;          // the probe it is compared with (read for forward, copy for fwd+bwd)
  double pct_bw = 0.0;              // gbps / probe_gbps * 100
  double baseline_ms = 0.0;         // 0: not measured
  double speedup = 0.0;             // baseline_ms / ms; 0: not measured
  int reps = 0;
  int baseline_reps = 0;
  std::string check = "ok";  // "ok", "FAIL", "error"
  std::string note;          // why check is not ok; printed as a warning row under the row
};

void print_table(std::ostream& os, const std::vector<Row>& rows);
// Same rows as CSV with a header line; false (and a message on stderr) when the file cannot be written.
bool write_csv(const std::string& path, const std::vector<Row>& rows);

// ---- options, suites and the runner -------------------------------------------------------------------

struct Options {
  std::vector<std::string> losses;                // empty: every registered suite
  std::vector<std::vector<std::int64_t>> shapes;  // empty: each suite's defaults (or quick shapes)
  std::vector<DType> dtypes;                      // empty: each suite's defaults
  int threads = 0;                                // <= 0: lossfuse's default
  int reps = 0;                                   // > 0: fixed reps for every measurement
  double min_time_s = 0.3;                        // per measurement, when reps are adaptive
  bool quick = false;                             // small shapes and a shorter min time
  bool baseline = true;                           // time the scalar baseline (it is always run once to check)
  std::string csv_path;
};

class Run;

// A unit of work that owns its inputs (allocated inside run, freed when it returns) and produces `steps`
// rows, calling run.step() before each.
struct Group {
  int steps = 0;
  std::function<void(Run&)> run;
};

struct Suite {
  std::string name;                // the loss: "cross_entropy"
  std::vector<std::string> notes;  // header lines: what is timed, what the baseline is
  int shape_rank = 2;              // dims per --shapes entry
  std::string shape_help;          // "NxV"
  std::vector<std::vector<std::int64_t>> default_shapes, quick_shapes;
  std::vector<DType> dtypes, default_dtypes;  // supported, and run by default
  std::function<std::vector<Group>(const Options&, const std::vector<std::vector<std::int64_t>>& shapes,
                                   const std::vector<DType>& dtypes)>
      plan;
};

bool register_suite(Suite suite);
const std::vector<Suite>& suites();

#define LOSSFUSE_BENCH_CONCAT_(a, b) a##b
#define LOSSFUSE_BENCH_CONCAT(a, b) LOSSFUSE_BENCH_CONCAT_(a, b)
// At namespace scope in bench/<loss>_bench.cpp: LOSSFUSE_BENCH_SUITE(make_suite());
#define LOSSFUSE_BENCH_SUITE(...)                                                                  \
  [[maybe_unused]] static const bool LOSSFUSE_BENCH_CONCAT(lossfuse_bench_registered_, __LINE__) = \
      ::lossfuse::bench::register_suite(__VA_ARGS__)

// Times `kernel` interleaved with `probe` (the read or copy probe of the same bytes), and `baseline` when the
// run asks for it; fills the timing fields of `row` (`moved`: the bytes the kernel reads and writes) and returns
// the progress text "1.234 ms, 40.1 GB/s (95% of read)" (`probe_name`), with the speedup and a failed check.
class Run;
std::string time_row(Run& run, Row& row, const std::function<void()>& kernel, const std::function<void()>& probe,
                     const char* probe_name, double moved, const std::function<void()>* baseline = nullptr);

// The check-then-time tail every entry shares, for one row: runs `kernel` once (a throw makes the row an error row,
// not timed); `check()` then returns "" when the result agrees with its reference, else the disagreement, which makes
// the row a FAIL (timed anyway); then time_row against the probe of the direction: the read probe of `probe_bytes`
// at `src` (forward), or the copy probe of `probe_bytes` from `src` to `dst` (with a backward, `copy`). Adds the row
// and finishes the progress step.
struct ProbeSpec {
  bool copy = false;
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};
void check_and_time(Run& run, Row row, const std::function<void()>& kernel, const std::function<std::string()>& check,
                    const ProbeSpec& probe, double moved, const std::function<void()>* baseline = nullptr);

// What a group sees while it runs.
class Run {
 public:
  Run(const Options& options, int threads, int total_steps);

  [[nodiscard]] const Options& options() const noexcept { return options_; }
  [[nodiscard]] int threads() const noexcept { return threads_; }
  // Progress on stderr: "[k/total] label ..."; finish_step appends a short result to that line.
  void step(std::string_view label);
  void finish_step(std::string_view result);
  void add(Row row);
  [[nodiscard]] const std::vector<Row>& rows() const noexcept { return rows_; }

  // Probes at this byte size, measured once per size and cached (src is read, dst is overwritten).
  const Bandwidth& bandwidth(const void* src, void* dst, std::size_t bytes);
  [[nodiscard]] const std::map<std::size_t, Bandwidth>& probes() const noexcept { return probes_; }

  [[nodiscard]] RepPolicy kernel_policy() const;
  [[nodiscard]] RepPolicy baseline_policy() const;  // allows 2 reps when one call takes >= 0.5 s

 private:
  const Options& options_;
  int threads_;
  int total_;
  int done_ = 0;
  bool open_line_ = false;
  std::vector<Row> rows_;
  std::map<std::size_t, Bandwidth> probes_;
};

// Plans and runs the selected suites, prints the header and table on stdout and writes the CSV.
// Returns 0, 1 when a correctness check failed or a kernel threw, 2 on bad options.
int run_bench(const Options& options);

// "2 threads, AMD EPYC ..., host SIMD: avx512f ..." (lossfuse's own dispatched target is not public API).
std::string machine_line(int threads);
// The 1-minute load average from /proc/loadavg; -1 where there is none.
double load_average();
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace lossfuse::bench
