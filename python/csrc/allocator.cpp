// The torch binding's allocator of large outputs (allocator.hpp).
#include "allocator.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace lossfuse::torch_binding {
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

}  // namespace

at::Tensor new_output(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, &large_block_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, std::nullopt);
}


void empty_output_cache() { large_block_allocator().empty_cache(); }

}  // namespace lossfuse::torch_binding
