// TensorView: contiguous(), numel, is_contiguous, shape_string.
#include <gtest/gtest.h>

#include <cstdint>

#include "test_util.hpp"

namespace lftest {
namespace {

TEST(TensorView, ContiguousStrides) {
  float buf[1];
  const TensorView v = TensorView::contiguous(buf, DType::f32, {2, 3, 4});
  EXPECT_EQ(v.data, buf);
  EXPECT_EQ(v.dtype, DType::f32);
  EXPECT_EQ(v.device, lossfuse::Device::cpu);
  ASSERT_EQ(v.ndim, 3);
  EXPECT_EQ(v.shape[0], 2);
  EXPECT_EQ(v.shape[1], 3);
  EXPECT_EQ(v.shape[2], 4);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());

  const std::int64_t shape[4] = {5, 1, 7, 2};
  const TensorView w = TensorView::contiguous(buf, DType::bf16, shape, 4, lossfuse::Device::cuda);
  EXPECT_EQ(w.device, lossfuse::Device::cuda);
  ASSERT_EQ(w.ndim, 4);
  EXPECT_EQ(w.strides[0], 14);
  EXPECT_EQ(w.strides[2], 2);
  EXPECT_EQ(w.strides[3], 1);
  EXPECT_EQ(w.numel(), 70);
  EXPECT_TRUE(w.is_contiguous());
}

TEST(TensorView, ScalarAndEmpty) {
  double d = 0;
  const TensorView s = TensorView::contiguous(&d, DType::f64, {});
  EXPECT_EQ(s.ndim, 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.is_contiguous());
  const TensorView e = TensorView::contiguous(nullptr, DType::f32, {3, 0, 5});
  EXPECT_EQ(e.numel(), 0);
  // An empty tensor is contiguous whatever its strides (torch gives (5, 0, 7) strides (7, 7, 1)).
  TensorView z = TensorView::contiguous(nullptr, DType::f32, {5, 0, 7});
  z.strides = {7, 7, 1};
  EXPECT_TRUE(z.is_contiguous());
}

TEST(TensorView, NonContiguous) {
  float buf[1];
  TensorView t = TensorView::contiguous(buf, DType::f32, {4, 6});
  std::swap(t.shape[0], t.shape[1]);
  std::swap(t.strides[0], t.strides[1]);  // a transpose: (6, 4) with strides (1, 6)
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 24);
  TensorView sl = TensorView::contiguous(buf, DType::f32, {4, 6});
  sl.shape[1] = 5;  // x[:, :5]
  EXPECT_FALSE(sl.is_contiguous());
  EXPECT_EQ(sl.numel(), 20);
  TensorView st = TensorView::contiguous(buf, DType::f32, {8});
  st.strides[0] = 2;  // x[::2]
  EXPECT_FALSE(st.is_contiguous());
  // the strided layouts the tests build are recognised as such
  for (Layout l : {Layout::transposed, Layout::padded})
    EXPECT_FALSE(Tensor::make(DType::f32, {3, 4}, l).view.is_contiguous()) << layout_name(l);
  EXPECT_TRUE(Tensor::make(DType::f32, {3, 4}).view.is_contiguous());
}

TEST(TensorView, ShapeString) {
  const TensorView v = TensorView::contiguous(nullptr, DType::f32, {4, 32000});
  EXPECT_EQ(v.shape_string(), "(4, 32000)");
  const TensorView w = TensorView::contiguous(nullptr, DType::f32, {2, 0, 3});
  EXPECT_EQ(w.shape_string(), "(2, 0, 3)");
}

TEST(TensorView, TooManyDimsThrows) {
  const std::int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_TRUE(throws_error([&] { (void)TensorView::contiguous(nullptr, DType::f32, shape, 9); },
                           {ErrorCode::invalid_value, ErrorCode::shape_mismatch}));
  EXPECT_TRUE(throws_error([&] { (void)TensorView::contiguous(nullptr, DType::f32, {1, 1, 1, 1, 1, 1, 1, 1, 1}); },
                           {ErrorCode::invalid_value, ErrorCode::shape_mismatch}));
  EXPECT_NO_THROW((void)TensorView::contiguous(nullptr, DType::f32, shape, 8));
}

TEST(Error, CarriesItsParts) {
  const lossfuse::Error e(ErrorCode::index_error, "target", "a class in [0, 5)", "7 at position [3]");
  EXPECT_EQ(e.code(), ErrorCode::index_error);
  EXPECT_EQ(e.argument(), "target");
  EXPECT_EQ(e.expected(), "a class in [0, 5)");
  EXPECT_EQ(e.actual(), "7 at position [3]");
  const std::string what = e.what();
  EXPECT_NE(what.find("target"), std::string::npos) << what;
  EXPECT_NE(what.find("[0, 5)"), std::string::npos) << what;
  EXPECT_NE(what.find("7 at position [3]"), std::string::npos) << what;
}

}  // namespace
}  // namespace lftest
