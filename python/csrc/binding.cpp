// The lossfuse torch library: the shared conversions, the thread-pool hook, and the small ops every loss's
// autograd uses.
#include "binding.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/Parallel.h>
#include <sys/mman.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "lossfuse/catalog.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::torch_binding {
namespace {

std::optional<DType> dtype_of(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::f32;
    case at::kDouble: return DType::f64;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kByte: return DType::u8;
    case at::kChar: return DType::i8;
    case at::kShort: return DType::i16;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    default: return std::nullopt;
  }
}

// Kernels split their work with lossfuse::parallel_for; inside torch it runs on torch's intra-op pool, so
// torch.set_num_threads applies and no second pool (or OpenMP runtime) is started. at::parallel_for is a header
// template whose OpenMP body exists only where _OPENMP is defined: this file is compiled with -fopenmp (and the
// library links the libgomp.so.1 torch has loaded already), else every kernel would run on one thread.
void torch_parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, ParallelBody body, void* ctx) {
  at::parallel_for(begin, end, grain, [&](std::int64_t b, std::int64_t e) { body(ctx, b, e); });
}

const bool g_hook_installed = [] {
  set_parallel_for_hook(&torch_parallel_for);
  return true;
}();

}  // namespace

TensorView view(const at::Tensor& t, const char* arg) {
  TORCH_CHECK(t.defined(), "lossfuse: ", arg, ": expected a tensor, got None");
  TORCH_CHECK(t.device().is_cpu(), "lossfuse: ", arg, ": expected a CPU tensor, got one on ", t.device(),
              " (this build has CPU kernels only)");
  const auto dt = dtype_of(t.scalar_type());
  TORCH_CHECK(dt.has_value(), "lossfuse: ", arg,
              ": expected float32, float64, float16, bfloat16 or an integer dtype, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() <= kMaxDims, "lossfuse: ", arg, ": expected at most ", kMaxDims, " dims, got ",
                    t.dim());
  TensorView v;
  v.data = t.numel() > 0 ? const_cast<void*>(t.const_data_ptr()) : nullptr;
  v.dtype = *dt;
  v.device = Device::cpu;
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

std::optional<TensorView> view(const std::optional<at::Tensor>& t, const char* arg) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return view(*t, arg);
}

Reduction reduction(std::int64_t r) {
  switch (r) {
    case 0: return Reduction::none;
    case 1: return Reduction::mean;
    case 2: return Reduction::sum;
    default: TORCH_CHECK_VALUE(false, "lossfuse: reduction: expected 0 (none), 1 (mean) or 2 (sum), got ", r);
  }
}

at::ScalarType acc_type(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

namespace {

// Large outputs (a gradient the size of the logits) are written once, right after they are allocated. torch's
// CPU allocator (glibc's malloc) often maps such blocks afresh, and with 4 KiB pages the first write faults every
// page: for a 4096 x 32000 float32 gradient that costs several times the loss kernel itself. So outputs of at
// least kOwnBlock bytes get their own mapping, and the last kKeptBlocks freed are kept, still mapped and resident,
// for the next allocations of the same rounded sizes (a training loop asks for the same gradients every step: dx,
// dW and db of a fused linear loss are three blocks): no fault at all then. A freed block unmaps those held longest
// while more than kKeptBlocks, or more than one holding over kKeptBytes in all, are held (the newest one is kept
// whatever its size); lossfuse.empty_cache() (the op _empty_cache) unmaps them all. Blocks of at least
// kHugeBlock bytes are also placed on a 2 MiB boundary and advised as transparent huge pages
// (madvise(MADV_HUGEPAGE)): a fresh one costs one fault per 2 MiB where the kernel gives huge pages. (Keeping the
// block matters on virtual machines that hand free memory back to the host, free page reporting: a fresh huge
// page there can cost more than the 4 KiB pages it replaces.)
// LOSSFUSE_KEEP_BLOCK=0 in the environment holds no block between calls (and leaves blocks under kHugeBlock to
// torch's allocator); LOSSFUSE_HUGE_PAGES=0 gives no huge-page advice. A failed mapping falls back to torch's
// allocator.
constexpr std::size_t kPage = std::size_t{4} << 10;
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kOwnBlock = std::size_t{1} << 20;
constexpr std::size_t kHugeBlock = std::size_t{32} << 20;
constexpr std::size_t kKeptBlocks = 4;
constexpr std::size_t kKeptBytes = std::size_t{4} << 30;

struct Mapping {
  void* base;
  std::size_t length;
};

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

class LargeBlockAllocator final : public c10::Allocator {
 public:
  LargeBlockAllocator() { kept_.reserve(kKeptBlocks + 1); }  // the deleter never grows it
  c10::DataPtr allocate(std::size_t n) override {
    const bool huge = huge_pages_ && n >= kHugeBlock;
    if (n < kOwnBlock || !(keep_ || huge)) return c10::GetCPUAllocator()->allocate(n);
    const std::size_t unit = huge ? kHugePage : kPage;
    const std::size_t length = (n + unit - 1) / unit * unit;
    Mapping* m = take(length);
    if (m == nullptr) m = map(length, huge);
    if (m == nullptr) return c10::GetCPUAllocator()->allocate(n);
    return {m->base, m, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  // Unmaps the blocks held for reuse.
  void empty_cache() {
    while (Mapping* m = take(0)) unmap(m);
  }

 private:
  // A held block of `length` bytes (any held block for 0), taken out of the held list, else nullptr.
  Mapping* take(std::size_t length) {
    const std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < kept_.size(); ++i) {
      Mapping* m = kept_[i];
      if (length != 0 && m->length != length) continue;
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
      return m;
    }
    return nullptr;
  }
  static Mapping* map(std::size_t length, bool huge) {
    auto m = std::make_unique<Mapping>(Mapping{nullptr, length});
    if (!huge) {
      void* raw = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) return nullptr;
      m->base = raw;
      return m.release();
    }
    // Over-map by one huge page, then trim both ends so the block starts on a 2 MiB boundary.
    void* raw = ::mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto begin = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (begin + kHugePage - 1) & ~(std::uintptr_t{kHugePage} - 1);
    if (aligned > begin) ::munmap(raw, aligned - begin);
    const std::uintptr_t tail = begin + length + kHugePage - (aligned + length);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + length), tail);
    m->base = reinterpret_cast<void*>(aligned);
    ::madvise(m->base, length, MADV_HUGEPAGE);  // advice only: without THP the pages are ordinary ones
    return m.release();
  }
  static void unmap(Mapping* m) {
    if (m == nullptr) return;
    ::munmap(m->base, m->length);
    delete m;
  }
  // The DataPtr's deleter: the block joins the held ones (those held longest are unmapped when there are too many).
  static void release(void* ctx);

  const bool huge_pages_ = env_on("LOSSFUSE_HUGE_PAGES");
  const bool keep_ = env_on("LOSSFUSE_KEEP_BLOCK");
  std::mutex mu_;
  std::vector<Mapping*> kept_;  // oldest first
};

// Never destroyed: tensors may be freed after static destructors have run.
LargeBlockAllocator& large_block_allocator() {
  static auto* a = new LargeBlockAllocator;
  return *a;
}

void LargeBlockAllocator::release(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  LargeBlockAllocator& a = large_block_allocator();
  if (!a.keep_) {
    unmap(m);
    return;
  }
  std::array<Mapping*, kKeptBlocks + 1> old{};  // no allocation in a deleter
  std::size_t evicted = 0;
  {
    const std::lock_guard<std::mutex> lock(a.mu_);
    a.kept_.push_back(m);
    std::size_t bytes = 0;
    for (const Mapping* k : a.kept_) bytes += k->length;
    while (a.kept_.size() > kKeptBlocks || (a.kept_.size() > 1 && bytes > kKeptBytes)) {
      bytes -= a.kept_.front()->length;
      old[evicted++] = a.kept_.front();
      a.kept_.erase(a.kept_.begin());
    }
  }
  for (std::size_t i = 0; i < evicted; ++i) unmap(old[i]);
}

at::Tensor new_output(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, &large_block_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, std::nullopt);
}

}  // namespace

at::Tensor new_acc(const at::Tensor& input, at::IntArrayRef shape) { return new_output(shape, acc_type(input)); }

at::Tensor new_lse(const at::Tensor& /*logits*/, at::IntArrayRef rows) { return new_output(rows, at::kDouble); }

at::Tensor new_loss(const at::Tensor& input, at::IntArrayRef rows, std::int64_t r) {
  return r == 0 ? new_acc(input, rows) : new_acc(input, {});
}

at::Tensor new_grad(const at::Tensor& like, bool wanted) {
  return new_output(wanted ? like.sizes() : at::IntArrayRef({0}), like.scalar_type());
}

at::Tensor acc_grad_output(const at::Tensor& grad_output, const at::Tensor& input) {
  const auto acc = acc_type(input);
  return grad_output.scalar_type() == acc ? grad_output : grad_output.to(acc);
}

TensorView output_view(const at::Tensor& t, const char* arg) {
  TensorView v = view(t, arg);
  if (t.numel() == 0) {
    std::int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.strides[d] = stride;
      stride *= v.shape[d];
    }
  }
  return v;
}

void rethrow(const Error& e) {
  const std::string msg = e.what();
  switch (e.code()) {
    case ErrorCode::index_error: TORCH_CHECK_INDEX(false, msg);
    case ErrorCode::invalid_value:
    case ErrorCode::shape_mismatch: TORCH_CHECK_VALUE(false, msg);
    case ErrorCode::not_implemented: TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case ErrorCode::dtype_mismatch:
    case ErrorCode::bad_pointer: break;
  }
  TORCH_CHECK(false, msg);
}

namespace {

// Brings a gradient computed with an upstream gradient of `applied` to one of `grad_output` (both one element),
// in place, and records the new scale in `applied`. Costs nothing in the common case grad_output == applied
// (a training step's loss.backward()). The autograd of cross_entropy and linear_cross_entropy calls it on a
// gradient made in the forward just before handing it over (once: a retained graph's next backward makes a new one).
void rescale_grad_(const at::Tensor& grad, const at::Tensor& applied, const at::Tensor& grad_output) {
  TORCH_CHECK(applied.numel() == 1 && grad_output.numel() == 1,
              "lossfuse: rescale_grad_: expected one-element scales, got ", applied.numel(), " and ",
              grad_output.numel());
  const double was = applied.item<double>();
  const double want = grad_output.item<double>();
  if (want == was) return;
  if (was != 0.0 && std::isfinite(was)) {
    grad.mul_(want / was);
  } else {
    TORCH_CHECK(false, "lossfuse: rescale_grad_: a gradient already scaled by ", was,
                " cannot be rescaled; run backward through this loss once");
  }
  applied.fill_(want);
}

void empty_cache() { large_block_allocator().empty_cache(); }

// How many distinct threads of torch's pool lossfuse::parallel_for runs `n` unit tasks on (grain 1): the test
// that kernels really spread over torch.set_num_threads threads.
std::int64_t parallel_threads(std::int64_t n) {
  std::mutex mu;
  std::set<int> seen;
  parallel_for(0, n, 1, [&](std::int64_t, std::int64_t) {
    const int id = at::get_thread_num();
    const std::lock_guard<std::mutex> lock(mu);
    seen.insert(id);
  });
  return static_cast<std::int64_t>(seen.size());
}

// The op catalog as CSV (lossfuse.catalog()).
std::string catalog_csv() { return lossfuse::catalog_text(lossfuse::CatalogFormat::csv); }

}  // namespace

}  // namespace lossfuse::torch_binding

TORCH_LIBRARY(lossfuse, m) {
  m.def("rescale_grad_(Tensor(a!) grad, Tensor(b!) applied, Tensor grad_output) -> ()");
  m.def("_parallel_threads(int n) -> int");
  m.def("_empty_cache() -> ()");
  m.def("_catalog() -> str");
}

TORCH_LIBRARY_IMPL(lossfuse, CPU, m) { m.impl("rescale_grad_", &lossfuse::torch_binding::rescale_grad_); }

TORCH_LIBRARY_IMPL(lossfuse, CompositeExplicitAutograd, m) {
  m.impl("_parallel_threads", &lossfuse::torch_binding::parallel_threads);
  m.impl("_empty_cache", &lossfuse::torch_binding::empty_cache);
  m.impl("_catalog", &lossfuse::torch_binding::catalog_csv);
}
