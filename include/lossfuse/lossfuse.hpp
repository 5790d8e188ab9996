// lossfuse: the whole public API.
#pragma once

#include "lossfuse/catalog.hpp"
#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/ctc.hpp"
#include "lossfuse/device.hpp"
#include "lossfuse/dtype.hpp"
#include "lossfuse/error.hpp"
#include "lossfuse/gemm.hpp"
#include "lossfuse/linear_cross_entropy.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/margin.hpp"
#include "lossfuse/nll.hpp"
#include "lossfuse/parallel.hpp"
#include "lossfuse/pointwise.hpp"
#include "lossfuse/tensor.hpp"
