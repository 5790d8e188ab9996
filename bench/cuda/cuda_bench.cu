// lossfuse CUDA bench: cross-entropy through the public C++ API on device tensors, against the device's own
// read-only and copy probes. Prints one CSV row per (shape, dtype, mode): the median time per call over timed
// repetitions (CUDA events around the whole call, host-side checks and copies included), the bytes the call must
// move, GB/s and the percentage of the matching probe (forward: read probe; forward+backward: copy probe).
// Usage: lossfuse_cuda_bench [csv path [rows,classes,dtype,mode]]: the fourth argument runs that one case (for a
// profiler: ncu -k regex:ce_rows). scripts/gpu_check.sh runs it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/dtype.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Reads n 16-byte words; one value per block keeps the loads live.
__global__ void read_probe(const uint4* p, std::int64_t n, unsigned* out) {
  unsigned acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__global__ void fill_random(std::uint16_t* p, std::int64_t n, std::uint32_t seed, bool bf16) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = static_cast<float>(h & 0xffffff) / 16777216.0f;  // [0, 1)
    const float v = 4.0f * (u - 0.5f);
    if (bf16) {
      p[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);
    } else {
      reinterpret_cast<float*>(p)[i] = v;
    }
  }
}

template <class F>
double median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a), "record");
    f();
    ok(cudaEventRecord(b), "record");
    ok(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  ok(cudaEventDestroy(a), "event");
  ok(cudaEventDestroy(b), "event");
  return t[t.size() / 2];
}

TensorView view2(void* p, DType dt, std::int64_t n, std::int64_t c) {
  return TensorView::contiguous(p, dt, {n, c}, lossfuse::Device::cuda);
}

}  // namespace

int main(int argc, char** argv) {
  FILE* csv = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  const std::string only = argc > 2 ? argv[2] : "";
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // probes on 4 GiB (well past L2)
  const std::int64_t probe_bytes = std::int64_t{4} << 30;
  void *pa = nullptr, *pb = nullptr;
  unsigned* sink = nullptr;
  ok(cudaMalloc(&pa, probe_bytes), "malloc");
  ok(cudaMalloc(&pb, probe_bytes), "malloc");
  ok(cudaMalloc(&sink, 1 << 20), "malloc");
  fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(pa), probe_bytes / 2, 7, true);
  const double read_ms = median_ms([&] {
    read_probe<<<prop.multiProcessorCount * 8, 512>>>(static_cast<const uint4*>(pa), probe_bytes / 16, sink);
  }, 10);
  const double copy_ms = median_ms([&] { ok(cudaMemcpyAsync(pb, pa, probe_bytes, cudaMemcpyDeviceToDevice), "copy"); },
                                   10);
  const double read_gbs = static_cast<double>(probe_bytes) / read_ms / 1e6;
  const double copy_gbs = 2.0 * static_cast<double>(probe_bytes) / copy_ms / 1e6;
  ok(cudaFree(pa), "free");
  ok(cudaFree(pb), "free");
  std::printf("probe: read %.0f GB/s, copy %.0f GB/s (read + write)\n", read_gbs, copy_gbs);
  const char* header = "kind,rows,classes,dtype,mode,us_per_call,bytes,gb_per_s,pct_of_probe\n";
  std::printf("%s", header);
  if (csv) {
    std::fprintf(csv, "probe,read,,,,,,%.1f,\nprobe,copy,,,,,,%.1f,\n", read_gbs, copy_gbs);
    std::fprintf(csv, "%s", header);
  }

  struct Shape {
    std::int64_t n, c;
    DType dt;
  };
  const Shape shapes[] = {{32, 32000, DType::f32},     {128, 32000, DType::f32},     {32, 50257, DType::f32},
                          {4096, 32000, DType::f32},   {4096, 32000, DType::bf16},   {8192, 32000, DType::bf16},
                          {8192, 128256, DType::bf16}, {16384, 131072, DType::bf16}, {8192, 128256, DType::f32}};
  for (const Shape& s : shapes) {
    const std::string shape_key = std::to_string(s.n) + "," + std::to_string(s.c) + "," +
                                  std::string(lossfuse::dtype_name(s.dt)) + ",";
    if (!only.empty() && only.rfind(shape_key, 0) != 0) continue;
    const std::int64_t elems = s.n * s.c;
    const std::size_t esz = lossfuse::dtype_size(s.dt);
    void *x = nullptr, *g = nullptr, *t = nullptr, *loss = nullptr, *lse = nullptr;
    ok(cudaMalloc(&x, elems * esz), "malloc");
    ok(cudaMalloc(&g, elems * esz), "malloc");
    ok(cudaMalloc(&t, s.n * 8), "malloc");
    ok(cudaMalloc(&loss, 8), "malloc");
    ok(cudaMalloc(&lse, s.n * 4), "malloc");
    fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(x), s.dt == DType::bf16 ? elems : elems, 11,
                               s.dt == DType::bf16);
    std::vector<std::int64_t> targets(s.n);
    std::mt19937_64 rng(5);
    for (auto& v : targets) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s.c));
    ok(cudaMemcpy(t, targets.data(), s.n * 8, cudaMemcpyHostToDevice), "copy");
    ok(cudaDeviceSynchronize(), "fill");

    const TensorView xv = view2(x, s.dt, s.n, s.c), gv = view2(g, s.dt, s.n, s.c);
    const TensorView tv = TensorView::contiguous(t, DType::i64, {s.n}, lossfuse::Device::cuda);
    lossfuse::CrossEntropyOutputs out;
    out.loss = TensorView::contiguous(loss, DType::f32, {}, lossfuse::Device::cuda);
    out.lse = TensorView::contiguous(lse, DType::f32, {s.n}, lossfuse::Device::cuda);
    const lossfuse::CrossEntropyOptions o;
    const int reps = elems >= (std::int64_t{1} << 28) ? 10 : 30;
    const double logits_bytes = static_cast<double>(elems * esz);
    struct Mode {
      const char* name;
      double bytes;
      double probe;
    };
    const Mode modes[] = {{"forward", logits_bytes, read_gbs},
                          {"forward_backward", 2 * logits_bytes, copy_gbs},
                          {"forward_backward_in_place", 2 * logits_bytes, copy_gbs}};
    for (const Mode& m : modes) {
      const std::string mode = m.name;
      if (!only.empty() && only != shape_key + mode) continue;
      const double ms = median_ms([&] {
        if (mode == "forward") {
          lossfuse::cross_entropy_forward(xv, tv, o, out);
        } else if (mode == "forward_backward") {
          lossfuse::cross_entropy_forward_backward(xv, tv, o, out, std::nullopt, gv);
        } else {
          lossfuse::cross_entropy_forward_backward(xv, tv, o, out, std::nullopt, xv, lossfuse::GradWrite::in_place);
        }
      }, reps);
      const double gbs = m.bytes / ms / 1e6;
      const char* fmt = "cross_entropy,%lld,%lld,%s,%s,%.1f,%.0f,%.1f,%.1f\n";
      std::printf(fmt, static_cast<long long>(s.n), static_cast<long long>(s.c), lossfuse::dtype_name(s.dt).data(),
                  m.name, ms * 1e3, m.bytes, gbs, 100.0 * gbs / m.probe);
      if (csv) {
        std::fprintf(csv, fmt, static_cast<long long>(s.n), static_cast<long long>(s.c),
                     lossfuse::dtype_name(s.dt).data(), m.name, ms * 1e3, m.bytes, gbs, 100.0 * gbs / m.probe);
      }
    }
    for (void* p : {x, g, t, loss, lse}) ok(cudaFree(p), "free");
  }
  if (csv) std::fclose(csv);
  return 0;
}
