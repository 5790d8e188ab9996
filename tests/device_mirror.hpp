// lossfuse tests: running a harness's calls on another device. A Mirror gives each host test Tensor a view of a
// device copy of its whole storage (so sentinels around the view travel too) and copies every mirrored storage back
// on download(). With no DeviceMemory (the CPU) the views are the tensors' own and download() does nothing, so one
// harness serves every backend (tests/cuda/cuda_memory.hpp provides the CUDA one).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "test_util.hpp"

namespace lftest {

struct DeviceMemory {
  lossfuse::Device device;
  void* (*alloc)(std::size_t bytes);
  void (*release)(void* p);
  void (*to_device)(void* dst, const void* host, std::size_t bytes);
  void (*to_host)(void* host, const void* src, std::size_t bytes);
};

class Mirror {
 public:
  explicit Mirror(const DeviceMemory* mem) : mem_(mem) {}
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  ~Mirror() {
    for (const Entry& e : entries_) mem_->release(e.dev);
  }

  TensorView operator()(Tensor& t) {
    if (mem_ == nullptr) return t.view;
    void* dev = nullptr;
    for (const Entry& e : entries_) {
      if (e.t == &t) dev = e.dev;  // mirrored already (in place: one tensor is two operands)
    }
    if (dev == nullptr) dev = upload(t);
    TensorView v = t.view;
    const auto offset = static_cast<const std::uint8_t*>(t.view.data) - t.storage.data();
    v.data = static_cast<std::uint8_t*>(dev) + offset;
    v.device = mem_->device;
    return v;
  }
  std::optional<TensorView> operator()(std::optional<Tensor>& t) {
    if (!t) return std::nullopt;
    return (*this)(*t);
  }

  // Every mirrored tensor's storage from the device (outputs, and inputs that must be unchanged).
  void download() {
    if (mem_ == nullptr) return;
    for (const Entry& e : entries_) {
      if (!e.t->storage.empty()) mem_->to_host(e.t->storage.data(), e.dev, e.t->storage.size());
    }
  }

 private:
  struct Entry {
    Tensor* t;
    void* dev;
  };
  void* upload(Tensor& t) {
    const std::size_t bytes = t.storage.size();
    void* dev = mem_->alloc(bytes > 0 ? bytes : 1);
    if (bytes > 0) mem_->to_device(dev, t.storage.data(), bytes);
    entries_.push_back({&t, dev});
    return dev;
  }
  const DeviceMemory* mem_;
  std::vector<Entry> entries_;
};

}  // namespace lftest
