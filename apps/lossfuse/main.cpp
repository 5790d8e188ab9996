// lossfuse: the command line. Parses arguments and dispatches to a subcommand.
//
//   lossfuse bench [options]   times the loss kernels registered under bench/ (one <loss>_bench.cpp each)
//                              against this machine's measured bandwidth and a scalar baseline, then (where the
//                              source tree's .venv exists) the same rows against torch (python/bench/vs_torch.py);
//                              with --device cuda, runs the CUDA bench (bench/cuda/cuda_bench.cu, lossfuse_cuda_bench
//                              beside this one).
//   lossfuse bench-torch [options]
//                              runs python/bench/torch_bench.py (lossfuse's cross_entropy against PyTorch's,
//                              eager and compiled) with the source tree's .venv/bin/python, forwarding the options.
//   lossfuse catalog [--csv | --markdown]
//                              prints which (loss, dtype, device, direction) this build implements.
//   lossfuse bench-linear [options]
//                              runs python/bench/linear_bench.py (lossfuse's fused linear_cross_entropy against
//                              PyTorch's linear_cross_entropy, the unfused path and the GEMMs alone) the same way.
//   lossfuse plot CSV... [--out DIR]
//                              runs python/bench/plot.py: PNG charts and a leaderboard from the bench commands' CSV.
//
// Exit status: 0 ok, 1 a benchmark's correctness check failed or a kernel threw, 2 bad usage; bench-torch,
// bench-linear, plot and bench --device cuda return the program's status (127 when it cannot be started).
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench_common.hpp"
#include "lossfuse/catalog.hpp"
#include "lossfuse/parallel.hpp"

#ifndef LOSSFUSE_SOURCE_DIR
#error "LOSSFUSE_SOURCE_DIR (the source tree, for bench-torch and bench-linear) must be defined by the build"
#endif

namespace {

namespace lb = lossfuse::bench;

constexpr int kUsageError = 2;

struct UsageError {
  std::string message;
};

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    const auto i = s.find(sep);
    parts.push_back(s.substr(0, i));
    if (i == std::string_view::npos) {
      break;
    }
    s.remove_prefix(i + 1);
  }
  return parts;
}

template <class T>
T parse_number(std::string_view flag, std::string_view text, T lo, T hi) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !(value >= lo && value <= hi)) {
    std::ostringstream os;
    os << flag << " takes a number in [" << lo << ", " << hi << "], got '" << text << "'";
    throw UsageError{os.str()};
  }
  return value;
}

std::string join_shapes(const std::vector<std::vector<std::int64_t>>& shapes) {
  std::string s;
  for (const auto& shape : shapes) {
    if (!s.empty()) {
      s += ',';
    }
    for (std::size_t i = 0; i < shape.size(); ++i) {
      s += (i ? "x" : "") + std::to_string(shape[i]);
    }
  }
  return s;
}

void print_usage(std::ostream& os) {
  os << "usage: lossfuse <command> [options]\n"
        "\n"
        "commands:\n"
        "  bench        time lossfuse's loss kernels against this machine's memory bandwidth and a scalar "
        "baseline\n"
        "  bench-torch  time lossfuse's cross_entropy against PyTorch's (eager and torch.compile), with peak memory\n"
        "               (runs python/bench/torch_bench.py in the source tree's .venv; needs scripts/setup_python.sh)\n"
        "  bench-linear time lossfuse's fused linear_cross_entropy against PyTorch's, the unfused\n"
        "               cross_entropy(x @ W.T + b) and the three GEMMs alone, with peak memory\n"
        "               (runs python/bench/linear_bench.py the same way)\n"
        "  plot         PNG charts and a cross-entropy leaderboard from the bench commands' --csv files\n"
        "               (runs python/bench/plot.py the same way; needs matplotlib)\n"
        "  catalog      list which (loss, dtype, device, direction) this build implements (--csv, --markdown:\n"
        "               the README's support table)\n"
        "  help         this help (also -h, --help)\n"
        "\n"
        "'lossfuse <command> --help' describes a command's options.\n";
}

void print_bench_usage(std::ostream& os) {
  os << "usage: lossfuse bench [options]\n"
        "\n"
        "Times each registered loss on standard shapes and dtypes, forward and forward+backward, and prints a\n"
        "table: median time, effective GB/s, percent of the bandwidth this machine measured in the same run at\n"
        "the same byte size (read for forward, copy for forward+backward), and speedup over a plain scalar\n"
        "baseline on the same threads. Inputs are checked against the baseline before they are timed.\n"
        "Progress goes to stderr, the table to stdout.\n"
        "\n"
        "options:\n"
        "  --loss LIST      only these losses, comma-separated (default: all)\n"
        "  --shapes LIST    comma-separated shapes such as 32x32000,128x32000\n"
        "  --dtypes LIST    comma-separated dtypes such as f32,bf16\n"
        "  --threads N      threads for lossfuse, the baseline and the bandwidth probes (default: lossfuse's, "
     << lossfuse::get_num_threads()
     << " here)\n"
        "  --reps N         fixed number of timed calls per measurement (default: adaptive, 3 to 50, enough\n"
        "                   for --min-time; a baseline call over 0.5 s may take 2)\n"
        "  --min-time S     seconds per measurement when reps adapt (default 0.3; 0.05 with --quick)\n"
        "  --quick          only the small shapes, with a shorter min time (a smoke test)\n"
        "  --no-baseline    run the scalar baseline once for the check, but do not time it\n"
        "  --csv PATH       also write the rows as CSV\n"
        "  --no-torch       leave out the comparison with torch that follows the table (run where the source\n"
        "                   tree's .venv exists: scripts/setup_python.sh; python/bench/vs_torch.py)\n"
        "  --device D       cpu (default), or cuda: the CUDA bench on GPU 0 (every loss's kernels against the\n"
        "                   device's read and copy probes, the fused linear loss against its cuBLAS GEMMs);\n"
        "                   takes only --csv; in a build with the CUDA backend\n"
        "  -h, --help       this help\n"
        "\n"
        "losses:\n";
  for (const lb::Suite& s : lb::suites()) {
    os << "  " << s.name << "  shapes " << s.shape_help << ", dtypes";
    for (std::size_t i = 0; i < s.dtypes.size(); ++i) {
      os << (i ? "," : " ") << lb::short_dtype_name(s.dtypes[i]);
    }
    os << "\n    default shapes " << join_shapes(s.default_shapes) << "\n    --quick shapes "
       << join_shapes(s.quick_shapes) << '\n';
  }
  os << "\n"
        "exit status: 0 ok, 1 a correctness check failed or a kernel threw, 2 bad usage\n";
}

// device: --device's value; cpu_options: whether an option the CPU bench alone takes was given; torch: no
// --no-torch.
lb::Options parse_bench_args(std::span<const std::string_view> args, bool& help, std::string& device,
                             bool& cpu_options, bool& torch) {
  lb::Options o;
  std::optional<double> min_time;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    std::optional<std::string_view> inline_value;
    if (flag.starts_with("--") && flag.find('=') != std::string_view::npos) {
      inline_value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) {
        return *inline_value;
      }
      if (i + 1 >= args.size()) {
        throw UsageError{std::string(flag) + " needs a value"};
      }
      return args[++i];
    };
    auto no_value = [&] {
      if (inline_value) {
        throw UsageError{std::string(flag) + " takes no value"};
      }
    };

    cpu_options = cpu_options || (flag != "-h" && flag != "--help" && flag != "--csv" && flag != "--device");
    if (flag == "-h" || flag == "--help") {
      no_value();
      help = true;
    } else if (flag == "--device") {
      device = std::string(value());
      if (device != "cpu" && device != "cuda") {
        throw UsageError{"--device takes cpu or cuda, got '" + device + "'"};
      }
    } else if (flag == "--quick") {
      no_value();
      o.quick = true;
    } else if (flag == "--no-baseline") {
      no_value();
      o.baseline = false;
    } else if (flag == "--no-torch") {
      no_value();
      torch = false;
    } else if (flag == "--loss") {
      for (std::string_view name : split(value(), ',')) {
        if (name.empty()) {
          throw UsageError{"--loss: empty name in the list"};
        }
        o.losses.emplace_back(name);
      }
    } else if (flag == "--shapes") {
      o.shapes.clear();
      for (std::string_view item : split(value(), ',')) {
        std::vector<std::int64_t> shape;
        for (std::string_view dim : split(item, 'x')) {
          shape.push_back(
              parse_number<std::int64_t>("--shapes: '" + std::string(item) + "':", dim, 1, std::int64_t{1} << 40));
        }
        o.shapes.push_back(std::move(shape));
      }
    } else if (flag == "--dtypes") {
      o.dtypes.clear();
      for (std::string_view name : split(value(), ',')) {
        lossfuse::DType t{};
        if (!lb::parse_dtype(name, t)) {
          throw UsageError{"--dtypes: unknown dtype '" + std::string(name) + "' (f32, f64, f16, bf16)"};
        }
        o.dtypes.push_back(t);
      }
    } else if (flag == "--threads") {
      o.threads = parse_number<int>("--threads", value(), 1, 4096);
    } else if (flag == "--reps") {
      o.reps = parse_number<int>("--reps", value(), 1, 1000000);
    } else if (flag == "--min-time") {
      const double t = parse_number<double>("--min-time", value(), 0.0, 3600.0);
      if (!(t > 0.0)) {
        throw UsageError{"--min-time must be > 0"};
      }
      min_time = t;
    } else if (flag == "--csv") {
      o.csv_path = std::string(value());
      if (o.csv_path.empty()) {
        throw UsageError{"--csv needs a file path"};
      }
    } else if (flag.starts_with("-")) {
      throw UsageError{"unknown option '" + std::string(args[i]) + "'"};
    } else {
      throw UsageError{"unexpected argument '" + std::string(args[i]) + "'"};
    }
  }
  o.min_time_s = min_time.value_or(o.quick ? 0.05 : 0.3);
  return o;
}

constexpr int kCannotRun = 127;

// Replaces this process with argv[0] (argv: null-terminated); returns only when it cannot be started.
int exec_replacing(std::string_view command, std::vector<std::string> argv_strings) {
  std::vector<char*> argv;
  for (std::string& a : argv_strings) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  std::cout.flush();
  std::cerr.flush();
  execv(argv[0], argv.data());
  std::cerr << "lossfuse " << command << ": cannot run " << argv[0] << ": " << std::strerror(errno) << '\n';
  return kCannotRun;
}

// bench --device cuda: lossfuse_cuda_bench from this executable's directory (the build directory, or the
// installed bin directory), given the --csv path.
int cuda_bench(const std::string& csv_path) {
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  const std::string dir = n > 0 ? self.substr(0, self.rfind('/', static_cast<std::size_t>(n))) : ".";
  const std::string bench = dir + "/lossfuse_cuda_bench";
  if (access(bench.c_str(), X_OK) != 0) {
    std::cerr << "lossfuse bench: --device cuda: no " << bench
              << " (it is built with the CUDA backend, when CMake finds nvcc)\n";
    return kCannotRun;
  }
  std::vector<std::string> argv{bench};
  if (!csv_path.empty()) {
    argv.push_back(csv_path);
  }
  return exec_replacing("bench", std::move(argv));
}

// The Python the bench scripts run with: $LOSSFUSE_PYTHON when set (*from_env), else the source tree's
// .venv/bin/python (made by scripts/setup_python.sh).
std::string script_python(bool* from_env = nullptr) {
  const char* python_env = std::getenv("LOSSFUSE_PYTHON");
  const bool env = python_env != nullptr && *python_env != '\0';
  if (from_env != nullptr) {
    *from_env = env;
  }
  return env ? std::string(python_env) : std::string(LOSSFUSE_SOURCE_DIR) + "/.venv/bin/python";
}

// After the table: its rows (options.csv_path) timed again against torch by python/bench/vs_torch.py, which
// replaces this process; a note instead where there is no Python environment. remove_rows: the CSV is a
// temporary file.
int compare_with_torch(const lb::Options& options, bool remove_rows) {
  const std::string python = script_python();
  if (access(python.c_str(), X_OK) != 0) {
    std::cout << "\nlossfuse vs torch: skipped (no Python environment at " << python
              << "; scripts/setup_python.sh makes one)\n";
    if (remove_rows) {
      std::remove(options.csv_path.c_str());
    }
    return 0;
  }
  const int threads = options.threads > 0 ? options.threads : lossfuse::get_num_threads();
  std::vector<std::string> argv{python, std::string(LOSSFUSE_SOURCE_DIR) + "/python/bench/vs_torch.py",
                                options.csv_path, "--threads", std::to_string(threads)};
  if (options.quick) {
    argv.emplace_back("--quick");
  }
  if (remove_rows) {
    argv.emplace_back("--remove-rows");
  }
  return exec_replacing("bench", std::move(argv));
}

// A temporary file for the rows when no --csv was given; empty when none can be made.
std::string temporary_rows_file() {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/lossfuse-bench-XXXXXX.csv";
  const int fd = mkstemps(path.data(), 4);
  if (fd < 0) {
    return {};
  }
  close(fd);
  return path;
}

int bench_command(std::span<const std::string_view> args) {
  bool help = false, cpu_options = false, torch = true;
  std::string device = "cpu";
  lb::Options options;
  try {
    options = parse_bench_args(args, help, device, cpu_options, torch);
    if (device == "cuda" && cpu_options && !help) {
      throw UsageError{"--device cuda takes only --csv (the CUDA bench runs its fixed shapes)"};
    }
  } catch (const UsageError& e) {
    std::cerr << "lossfuse bench: " << e.message << "\n(see 'lossfuse bench --help')\n";
    return kUsageError;
  }
  if (help) {
    print_bench_usage(std::cout);
    return 0;
  }
  if (device == "cuda") {
    return cuda_bench(options.csv_path);
  }
  const bool temporary = torch && options.csv_path.empty();
  if (temporary) {
    options.csv_path = temporary_rows_file();
    torch = !options.csv_path.empty();
  }
  const int status = lb::run_bench(options);
  if (status != 0 || !torch) {
    if (temporary && !options.csv_path.empty()) {
      std::remove(options.csv_path.c_str());
    }
    return status;
  }
  return compare_with_torch(options, temporary);
}

// bench-torch, bench-linear: replace this process with `<python> <source>/python/bench/<script> args...`, so the
// script's output and exit status are the command's. <python> is $LOSSFUSE_PYTHON when set, else the source tree's
// .venv/bin/python (made by scripts/setup_python.sh). Returns only when the script cannot be started.
int run_python_script(std::string_view command, std::string_view script_name, std::span<const std::string_view> args) {
  const std::string source_dir = LOSSFUSE_SOURCE_DIR;
  const std::string script = source_dir + "/python/bench/" + std::string(script_name);
  bool from_env = false;
  const std::string python = script_python(&from_env);
  if (access(python.c_str(), X_OK) != 0) {
    if (from_env) {
      std::cerr << "lossfuse " << command << ": LOSSFUSE_PYTHON=" << python << " is not an executable\n";
    } else {
      std::cerr << "lossfuse " << command << ": no Python environment at " << python
                << "\n(run scripts/setup_python.sh in " << source_dir << " first)\n";
    }
    return kCannotRun;
  }
  if (access(script.c_str(), R_OK) != 0) {
    std::cerr << "lossfuse " << command << ": the script " << script << " is missing\n";
    return kCannotRun;
  }
  std::vector<std::string> argv_strings{python, script};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  setenv("LOSSFUSE_CLI", "1", 1);  // the script then names itself 'lossfuse <command>' in its usage
  return exec_replacing(command, std::move(argv_strings));
}

int bench_torch_command(std::span<const std::string_view> args) {
  return run_python_script("bench-torch", "torch_bench.py", args);
}

int bench_linear_command(std::span<const std::string_view> args) {
  return run_python_script("bench-linear", "linear_bench.py", args);
}

int plot_command(std::span<const std::string_view> args) {
  return run_python_script("plot", "plot.py", args);
}

int catalog_command(std::span<const std::string_view> args) {
  lossfuse::CatalogFormat format = lossfuse::CatalogFormat::lines;
  for (const std::string_view a : args) {
    if (a == "--csv") {
      format = lossfuse::CatalogFormat::csv;
    } else if (a == "--markdown") {
      format = lossfuse::CatalogFormat::markdown;
    } else if (a == "-h" || a == "--help") {
      std::cout << "usage: lossfuse catalog [--csv | --markdown]\n\nPrints one line per implemented (loss, dtype, "
                   "device, direction); --csv adds a header line, --markdown prints the README's support table.\n";
      return 0;
    } else {
      std::cerr << "lossfuse catalog: takes --csv or --markdown, got '" << a << "'\n";
      return kUsageError;
    }
  }
  std::cout << lossfuse::catalog_text(format);
  return 0;
}

struct Command {
  std::string_view name;
  int (*run)(std::span<const std::string_view> args);
};

constexpr Command kCommands[] = {
    {"bench", bench_command},
    {"bench-torch", bench_torch_command},
    {"bench-linear", bench_linear_command},
    {"plot", plot_command},
    {"catalog", catalog_command},
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(std::cerr);
    return kUsageError;
  }
  const std::string_view cmd = args[0];
  if (cmd == "help" || cmd == "-h" || cmd == "--help") {
    print_usage(std::cout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (c.name == cmd) {
      try {
        return c.run(std::span(args).subspan(1));
      } catch (const std::exception& e) {
        std::cerr << "lossfuse " << cmd << ": " << e.what() << '\n';
        return 1;
      }
    }
  }
  std::cerr << "lossfuse: unknown command '" << cmd << "'\n\n";
  print_usage(std::cerr);
  return kUsageError;
}
