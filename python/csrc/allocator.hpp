// The torch binding's allocator of new outputs: blocks of 1 MiB and more get their own mappings, the last few freed
// are kept for the next outputs of the same sizes, and those of 32 MiB and more are 2 MiB-aligned and advised as
// transparent huge pages (allocator.cpp says why and how).
#pragma once

#include <ATen/ATen.h>

namespace lossfuse::torch_binding {

// A new contiguous CPU tensor from the large-block allocator (smaller ones go to torch's).
at::Tensor new_output(at::IntArrayRef shape, at::ScalarType dtype);

// Unmaps every kept block (lossfuse.empty_cache(), the op _empty_cache).
void empty_output_cache();

}  // namespace lossfuse::torch_binding
