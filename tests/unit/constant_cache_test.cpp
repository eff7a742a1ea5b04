// models::ConstantCache: make() runs once per key, keys are told apart, at most kMaxEntries are
// kept (a further key is made on every call), a key on another device is another entry, and a
// throwing make() keeps nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "models/runtime/constant_cache.h"

namespace libreyolo::models {
namespace {

TEST(ConstantCache, MakesOncePerKeyAndKeepsAtMostEight) {
  ConstantCache cache;
  int made = 0;
  auto get = [&](int64_t h) {
    return cache.get({h, 7}, at::kCPU, [&] {
      ++made;
      return at::full({1}, static_cast<double>(h));
    });
  };
  const auto a = get(3);
  EXPECT_EQ(a.item<double>(), 3.0);
  EXPECT_TRUE(get(3).is_same(a));
  EXPECT_EQ(made, 1);
  EXPECT_EQ(get(4).item<double>(), 4.0);
  EXPECT_EQ(made, 2);
  for (int64_t h = 5; h < 11; ++h) get(h);  // keys 3..10: eight kept
  EXPECT_EQ(made, 8);
  get(10);
  EXPECT_EQ(made, 8);
  get(11);
  get(11);  // a ninth key: made each time
  EXPECT_EQ(made, 10);
  EXPECT_TRUE(get(3).is_same(a));
  EXPECT_EQ(made, 10);
}

TEST(ConstantCache, TheDeviceIsPartOfTheKey) {
  ConstantCache cache;
  int made = 0;
  const at::Device meta(at::kMeta);
  const auto on_cpu = cache.get({1}, at::kCPU, [&] {
    ++made;
    return at::ones({2});
  });
  const auto on_meta = cache.get({1}, meta, [&] {
    ++made;
    return at::empty({2}, at::TensorOptions().device(meta));
  });
  EXPECT_EQ(made, 2);
  EXPECT_EQ(on_meta.device(), meta);
  EXPECT_TRUE(cache
                  .get({1}, at::kCPU,
                       [&] {
                         ++made;
                         return at::zeros({2});
                       })
                  .is_same(on_cpu));
  EXPECT_TRUE(cache
                  .get({1}, meta,
                       [&] {
                         ++made;
                         return at::empty({2}, at::TensorOptions().device(meta));
                       })
                  .is_same(on_meta));
  EXPECT_EQ(made, 2);
}

TEST(ConstantCache, AThrowingMakeKeepsNothing) {
  ConstantCache cache;
  EXPECT_THROW(cache.get({1}, at::kCPU, []() -> at::Tensor { throw std::runtime_error("no"); }),
               std::runtime_error);
  int made = 0;
  cache.get({1}, at::kCPU, [&] {
    ++made;
    return at::ones({1});
  });
  EXPECT_EQ(made, 1);
}

}  // namespace
}  // namespace libreyolo::models
