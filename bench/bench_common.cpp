// lossfuse bench: buffers, inputs, timing, bandwidth probes, result printing and the runner (see
// bench_common.hpp). The probes run on OpenMP with the thread count lossfuse uses; the timed calls and the
// probes see the same first-touched, huge-page-advised buffers.
#include "bench_common.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <new>
#include <numbers>
#include <sstream>

#include "lossfuse/parallel.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

// The probe loops are compiled for the widest vectors the CPU has (the kernels dispatch at run time too),
// so a narrow default build does not understate cache bandwidth.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define LF_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LF_BENCH_CLONES
#endif

namespace lossfuse::bench {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Static split of [0, n) into `parts` contiguous pieces, boundaries on multiples of `align`.
std::pair<std::size_t, std::size_t> chunk(std::size_t n, int parts, int index, std::size_t align) {
  std::size_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  const std::size_t b = std::min(n, per * index);
  return {b, std::min(n, b + per)};
}

LF_BENCH_CLONES std::uint64_t sum_words(const std::uint64_t* p, std::size_t n) {
  std::uint64_t s = 0;
  for (std::size_t i = 0; i < n; ++i) {
    s += p[i];
  }
  return s;
}

// XOR with a runtime zero keeps the loop an explicit load/store stream instead of a memcpy call (which may
// switch to non-temporal stores that the kernels do not use).
LF_BENCH_CLONES void copy_words(const std::uint64_t* src, std::uint64_t* dst, std::size_t n, std::uint64_t key) {
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = src[i] ^ key;
  }
}

volatile std::uint64_t g_sink = 0;
volatile std::uint64_t g_zero_key = 0;

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) {
    return s;
  }
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') {
      out += '"';
    }
    out += c;
  }
  return out + "\"";
}

std::string dims_string(const std::vector<std::int64_t>& shape, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? sep : "") + std::to_string(shape[i]);
  }
  return s;
}

std::vector<Suite>& registry() {
  static std::vector<Suite> r;
  return r;
}

}  // namespace

// ---- buffers ------------------------------------------------------------------------------------------

void Buffer::Free::operator()(void* p) const noexcept { std::free(p); }

Buffer::Buffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) {
    return;
  }
  const std::size_t align = bytes >= 2 * kHugePage ? kHugePage : 64;
  const std::size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) {
    throw std::bad_alloc();
  }
  ptr_.reset(p);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHugePage) {
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
  }
#endif
  auto* bytes_ptr = static_cast<unsigned char*>(p);
#pragma omp parallel
  {
    const auto [b, e] = chunk(rounded, omp_get_num_threads(), omp_get_thread_num(), 4096);
    if (e > b) {
      std::memset(bytes_ptr + b, 0, e - b);
    }
  }
}

// ---- inputs -------------------------------------------------------------------------------------------

void fill_normal(void* data, DType dtype, std::int64_t count, double stddev, std::uint64_t seed) {
  const std::int64_t pairs = (count + 1) / 2;
  const auto sd = static_cast<float>(stddev);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < pairs; ++i) {
    // Box-Muller from one 64-bit hash: 24 bits each for u1 in (0, 1] and u2 in [0, 1).
    const std::uint64_t h = splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(i)));
    const float u1 = static_cast<float>((h >> 40) + 1) * 0x1p-24f;
    const float u2 = static_cast<float>(h & 0xffffffu) * 0x1p-24f;
    const float r = sd * std::sqrt(-2.0f * std::log(u1));
    const float a = 2.0f * std::numbers::pi_v<float> * u2;
    const float v[2] = {r * std::cos(a), r * std::sin(a)};
    for (std::int64_t k = 0; k < 2 && 2 * i + k < count; ++k) {
      const std::int64_t j = 2 * i + k;
      switch (dtype) {
        case DType::f32: static_cast<float*>(data)[j] = v[k]; break;
        case DType::f64: static_cast<double*>(data)[j] = v[k]; break;
        case DType::bf16: static_cast<std::uint16_t*>(data)[j] = float_to_bf16(v[k]); break;
        default: break;  // callers pass f32, f64 or bf16 only
      }
    }
  }
}

void fill_uniform_index(std::int64_t* data, std::int64_t count, std::int64_t hi, std::uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < count; ++i) {
    data[i] = static_cast<std::int64_t>(splitmix64(~seed ^ splitmix64(static_cast<std::uint64_t>(i))) %
                                        static_cast<std::uint64_t>(hi));
  }
}

std::string_view short_dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    default: return dtype_name(t);
  }
}

bool parse_dtype(std::string_view s, DType& out) noexcept {
  for (DType t : kFloatDTypes) {
    if (s == short_dtype_name(t) || s == dtype_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

// ---- timing -------------------------------------------------------------------------------------------

std::vector<Timing> time_interleaved(const std::vector<std::function<void()>>& fns, const RepPolicy& policy) {
  using Clock = std::chrono::steady_clock;
  auto once = [](const std::function<void()>& fn) {
    const auto t0 = Clock::now();
    fn();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (int i = 0; i < policy.warmup; ++i) {
    for (const auto& fn : fns) {
      (void)once(fn);
    }
  }
  // Timed rounds until the time of the first function adds up to min_time_s (one noisy call cannot set the
  // count), within the bounds.
  std::vector<std::vector<double>> t(fns.size());
  double total = 0.0;
  auto enough = [&] {
    const auto n = static_cast<int>(t[0].size());
    if (policy.fixed_reps > 0) {
      return n >= policy.fixed_reps;
    }
    if (n == 0) {
      return false;
    }
    const int lo = t[0][0] >= policy.slow_call_s ? policy.min_reps_slow : policy.min_reps;
    return n >= policy.max_reps || (n >= lo && total >= policy.min_time_s);
  };
  while (!enough()) {
    for (std::size_t k = 0; k < fns.size(); ++k) {
      t[k].push_back(once(fns[k]));
    }
    total += t[0].back();
  }
  std::vector<Timing> out;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    out.push_back({v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]), static_cast<int>(v.size())});
  }
  return out;
}

Timing time_median(const std::function<void()>& fn, const RepPolicy& policy) {
  return time_interleaved({fn}, policy)[0];
}

// ---- bandwidth probes ---------------------------------------------------------------------------------

std::function<void()> read_probe(const void* src, std::size_t bytes, int threads) {
  const auto* s = static_cast<const std::uint64_t*>(src);
  const std::size_t words = bytes / sizeof(std::uint64_t);
  return [s, words, threads] {
    std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const auto [b, e] = chunk(words, omp_get_num_threads(), omp_get_thread_num(), 8);
      total += sum_words(s + b, e - b);
    }
    g_sink = g_sink + total;
  };
}

std::function<void()> copy_probe(const void* src, void* dst, std::size_t bytes, int threads) {
  const auto* s = static_cast<const std::uint64_t*>(src);
  auto* d = static_cast<std::uint64_t*>(dst);
  const std::size_t words = bytes / sizeof(std::uint64_t);
  const std::uint64_t key = g_zero_key;
  return [s, d, words, threads, key] {
#pragma omp parallel num_threads(threads)
    {
      const auto [b, e] = chunk(words, omp_get_num_threads(), omp_get_thread_num(), 8);
      copy_words(s + b, d + b, e - b, key);
    }
  };
}

Bandwidth measure_bandwidth(const void* src, void* dst, std::size_t bytes, int threads, const RepPolicy& policy) {
  const Timing read = time_median(read_probe(src, bytes, threads), policy);
  const Timing copy = time_median(copy_probe(src, dst, bytes, threads), policy);
  const double moved = static_cast<double>(bytes / sizeof(std::uint64_t) * sizeof(std::uint64_t));
  return {moved / read.median_s * 1e-9, 2.0 * moved / copy.median_s * 1e-9};
}

// ---- results ------------------------------------------------------------------------------------------

std::string shape_string(const std::vector<std::int64_t>& shape) { return "(" + dims_string(shape, ", ") + ")"; }

void print_table(std::ostream& os, const std::vector<Row>& rows) {
  const std::vector<std::string> head = {"loss",       "shape",      "dtype",       "direction", "median ms", "GB/s",
                                         "probe GB/s", "% of probe", "baseline ms", "speedup",   "reps",      "check"};
  std::vector<std::vector<std::string>> cells;
  cells.reserve(rows.size());
  for (const Row& r : rows) {
    cells.push_back(
        {r.loss, shape_string(r.shape), r.dtype, r.direction, r.ms > 0 ? format("%.4f", r.ms) : "-",
         r.ms > 0 ? format("%.1f", r.gbps) : "-", r.probe_gbps > 0 ? format("%.1f", r.probe_gbps) : "-",
         r.ms > 0 && r.probe_gbps > 0 ? format("%.0f%%", r.pct_bw) : "-",
         r.baseline_ms > 0 ? format("%.3f", r.baseline_ms) : "-", r.speedup > 0 ? format("%.1fx", r.speedup) : "-",
         r.reps > 0 ? std::to_string(r.reps) + "/" + (r.baseline_reps > 0 ? std::to_string(r.baseline_reps) : "-")
                    : "-",
         r.check});
  }
  std::vector<std::size_t> width(head.size());
  for (std::size_t c = 0; c < head.size(); ++c) {
    width[c] = head[c].size();
    for (const auto& row : cells) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto line = [&](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t c = 0; c < v.size(); ++c) {
      const bool left = c < 4 || c + 1 == v.size();
      const std::string pad(width[c] - v[c].size(), ' ');
      s += (c ? "  " : "") + (left ? v[c] + pad : pad + v[c]);
    }
    while (!s.empty() && s.back() == ' ') {
      s.pop_back();
    }
    os << s << '\n';
  };
  line(head);
  std::size_t total = 0;
  for (std::size_t w : width) {
    total += w + 2;
  }
  os << std::string(total - 2, '-') << '\n';
  for (std::size_t i = 0; i < rows.size(); ++i) {
    line(cells[i]);
    if (!rows[i].note.empty()) {
      os << "  !! " << rows[i].check << ": " << rows[i].note << '\n';
    }
  }
}

bool write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) {
    std::cerr << "lossfuse bench: cannot write --csv file '" << path << "'\n";
    return false;
  }
  f << "loss,shape,dtype,direction,median_ms,gbps,probe_gbps,pct_of_probe,baseline_ms,speedup,reps,baseline_reps,"
       "check,note\n";
  for (const Row& r : rows) {
    f << r.loss << ',' << dims_string(r.shape, "x") << ',' << r.dtype << ',' << r.direction << ','
      << format("%.6f", r.ms) << ',' << format("%.3f", r.gbps) << ',' << format("%.3f", r.probe_gbps) << ','
      << format("%.2f", r.pct_bw) << ',' << format("%.6f", r.baseline_ms) << ',' << format("%.3f", r.speedup) << ','
      << r.reps << ',' << r.baseline_reps << ',' << r.check << ',' << csv_field(r.note) << '\n';
  }
  f.flush();
  if (!f) {
    std::cerr << "lossfuse bench: error writing --csv file '" << path << "'\n";
    return false;
  }
  return true;
}

// ---- registry and runner ------------------------------------------------------------------------------

std::string time_row(Run& run, Row& row, const std::function<void()>& kernel, const std::function<void()>& probe,
                     const char* probe_name, double moved, const std::function<void()>* baseline) {
  const std::vector<Timing> tp = time_interleaved({kernel, probe}, run.kernel_policy());
  row.ms = tp[0].median_s * 1e3;
  row.reps = tp[0].reps;
  row.gbps = moved / tp[0].median_s * 1e-9;
  row.probe_gbps = moved / tp[1].median_s * 1e-9;
  row.pct_bw = 100.0 * row.gbps / row.probe_gbps;
  if (baseline != nullptr && run.options().baseline) {
    const Timing b = time_median(*baseline, run.baseline_policy());
    row.baseline_ms = b.median_s * 1e3;
    row.baseline_reps = b.reps;
    row.speedup = b.median_s / tp[0].median_s;
  }
  std::string result = format("%.3f ms, ", row.ms) + format("%.1f GB/s (", row.gbps) + format("%.0f%% of ", row.pct_bw) +
                       probe_name + ")";
  if (row.speedup > 0) result += format(", %.1fx baseline", row.speedup);
  if (row.check != "ok") result += "  [" + row.check + "]";
  return result;
}

void check_and_time(Run& run, Row row, const std::function<void()>& kernel, const std::function<std::string()>& check,
                    const ProbeSpec& probe, double moved, const std::function<void()>* baseline) {
  try {
    kernel();
  } catch (const std::exception& e) {
    row.check = "error";
    row.note = e.what();
    run.add(std::move(row));
    run.finish_step("error: lossfuse threw");
    return;
  }
  if (const std::string problem = check(); !problem.empty()) {
    row.check = "FAIL";
    row.note = problem + " (timed anyway)";
  }
  const std::function<void()> probe_fn = probe.copy ? copy_probe(probe.src, probe.dst, probe.bytes, run.threads())
                                                    : read_probe(probe.src, probe.bytes, run.threads());
  const std::string result = time_row(run, row, kernel, probe_fn, probe.copy ? "copy" : "read", moved, baseline);
  run.add(std::move(row));
  run.finish_step(result);
}

bool register_suite(Suite suite) {
  registry().push_back(std::move(suite));
  return true;
}

const std::vector<Suite>& suites() { return registry(); }

Run::Run(const Options& options, int threads, int total_steps)
    : options_(options), threads_(threads), total_(total_steps) {}

void Run::step(std::string_view label) {
  if (open_line_) {
    std::cerr << '\n';
  }
  ++done_;
  std::cerr << '[' << done_ << '/' << total_ << "] " << label << " ..." << std::flush;
  open_line_ = true;
}

void Run::finish_step(std::string_view result) {
  if (!open_line_) {
    return;
  }
  std::cerr << ' ' << result << '\n' << std::flush;
  open_line_ = false;
}

void Run::add(Row row) { rows_.push_back(std::move(row)); }

const Bandwidth& Run::bandwidth(const void* src, void* dst, std::size_t bytes) {
  auto it = probes_.find(bytes);
  if (it == probes_.end()) {
    it = probes_.emplace(bytes, measure_bandwidth(src, dst, bytes, threads_, kernel_policy())).first;
  }
  return it->second;
}

RepPolicy Run::kernel_policy() const {
  RepPolicy p;
  p.min_time_s = options_.min_time_s;
  p.fixed_reps = options_.reps;
  return p;
}

RepPolicy Run::baseline_policy() const {
  RepPolicy p = kernel_policy();
  p.slow_call_s = 0.5;
  p.min_reps_slow = 2;
  return p;
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double one_minute = -1.0;
  return f >> one_minute ? one_minute : -1.0;
}

std::string machine_line(int threads) {
  std::string cpu;
  {
    std::ifstream f("/proc/cpuinfo");
    std::string l;
    while (std::getline(f, l)) {
      if (l.rfind("model name", 0) == 0 && l.find(':') != std::string::npos) {
        cpu = l.substr(l.find(':') + 2);
        break;
      }
    }
  }
  std::string isa = "unknown";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    isa = "AVX-512 (F, BW)";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    isa = "AVX2 + FMA";
  } else if (__builtin_cpu_supports("sse4.2")) {
    isa = "SSE4.2";
  } else {
    isa = "SSE2";
  }
#elif defined(__aarch64__)
  isa = "NEON";
#endif
  std::ostringstream os;
  os << "machine: " << threads << " thread" << (threads == 1 ? "" : "s") << " (of " << omp_get_num_procs() << " cpus)"
     << (cpu.empty() ? "" : ", " + cpu) << ", host SIMD " << isa
     << " (lossfuse's dispatched target is not in its public API)";
  return os.str();
}

int run_bench(const Options& options) {
  // Select suites.
  std::vector<const Suite*> selected;
  for (const Suite& s : suites()) {
    if (options.losses.empty() ||
        std::find(options.losses.begin(), options.losses.end(), s.name) != options.losses.end()) {
      selected.push_back(&s);
    }
  }
  for (const std::string& name : options.losses) {
    if (std::none_of(suites().begin(), suites().end(), [&](const Suite& s) { return s.name == name; })) {
      std::cerr << "lossfuse bench: unknown loss '" << name << "' (available:";
      for (const Suite& s : suites()) {
        std::cerr << ' ' << s.name;
      }
      std::cerr << ")\n";
      return 2;
    }
  }

  // Validate shapes and dtypes per suite, then plan.
  std::vector<Group> groups;
  int total = 0;
  for (const Suite* s : selected) {
    auto shapes = !options.shapes.empty() ? options.shapes : options.quick ? s->quick_shapes : s->default_shapes;
    for (const auto& shape : shapes) {
      if (static_cast<int>(shape.size()) != s->shape_rank) {
        std::cerr << "lossfuse bench: " << s->name << " takes shapes " << s->shape_help << ", got "
                  << dims_string(shape, "x") << '\n';
        return 2;
      }
    }
    const auto dtypes = options.dtypes.empty() ? s->default_dtypes : options.dtypes;
    for (DType t : dtypes) {
      if (std::find(s->dtypes.begin(), s->dtypes.end(), t) == s->dtypes.end()) {
        std::cerr << "lossfuse bench: " << s->name << " has no bench entry for dtype " << short_dtype_name(t)
                  << " (supported:";
        for (DType u : s->dtypes) {
          std::cerr << ' ' << short_dtype_name(u);
        }
        std::cerr << ")\n";
        return 2;
      }
    }
    for (Group& g : s->plan(options, shapes, dtypes)) {
      total += g.steps;
      groups.push_back(std::move(g));
    }
  }

  if (options.threads > 0) {
    lossfuse::set_num_threads(options.threads);
  }
  const int threads = lossfuse::get_num_threads();
  omp_set_num_threads(threads);  // the bench's own loops (fill, first touch, probes) use as many

  std::cerr << "lossfuse bench: " << total << " measurements on " << threads << " thread" << (threads == 1 ? "" : "s")
            << (options.quick ? " (quick)" : "") << '\n';
  // Other work on the cpus skews every timing (a descheduled OpenMP thread stalls the whole call).
  const double load = load_average();
  if (load > 0.5) {
    std::cerr << "lossfuse bench: warning: load average " << format("%.2f", load) << " before starting on "
              << omp_get_num_procs() << " cpus; timings may be noisy\n";
  }
  Run run(options, threads, total);
  bool failed = false;
  for (const Group& g : groups) {
    try {
      g.run(run);
    } catch (const std::exception& e) {
      run.finish_step("error");
      std::cerr << "lossfuse bench: " << e.what() << '\n';
      failed = true;
    }
  }
  for (const Row& r : run.rows()) {
    failed = failed || r.check != "ok";
  }

  std::ostream& out = std::cout;
  out << "lossfuse bench\n" << machine_line(threads) << '\n';
  if (load >= 0.0) {
    out << "load average (1 min) before the run " << format("%.2f", load) << ", after "
        << format("%.2f", load_average()) << (load > 0.5 ? ": other work was running, timings may be noisy" : "")
        << '\n';
  }
  for (const Suite* s : selected) {
    for (const std::string& n : s->notes) {
      out << n << '\n';
    }
  }
  out << "timing: median of the timed reps after a warm-up call; reps adapt to size (>= " << options.min_time_s
      << " s per measurement, 3..50";
  if (options.reps > 0) {
    out << "; fixed at " << options.reps << " by --reps";
  }
  out << "); the reps column is lossfuse/baseline\n";
  out << "bandwidth probes (same byte size as the input, " << threads << (threads == 1 ? " thread" : " threads")
      << "; cache-sized buffers give cache bandwidth): read = sum of every word, copy = read+write "
         "with cached stores, counting both\n";
  for (const auto& [bytes, bw] : run.probes()) {
    const auto b = static_cast<double>(bytes);
    out << "  " << (b >= 1e6 ? format("%10.1f MB", b / 1e6) : format("%10.1f kB", b / 1e3)) << "   read "
        << format("%7.1f", bw.read_gbps) << " GB/s   copy " << format("%7.1f", bw.copy_gbps) << " GB/s\n";
  }
  out << "% of probe: forward against read, fwd+bwd against copy\n\n";
  print_table(out, run.rows());
  out << std::flush;

  if (!options.csv_path.empty() && !write_csv(options.csv_path, run.rows())) {
    return 1;
  }
  if (failed) {
    std::cerr << "lossfuse bench: some checks failed (see the rows marked FAIL or error)\n";
  }
  return failed ? 1 : 0;
}

}  // namespace lossfuse::bench
