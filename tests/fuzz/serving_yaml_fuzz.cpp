// libFuzzer target: <repo>/<model>/serving.yaml (server/config/serving_config.cpp
// parse_serving_config, with the per-model kernel policy of kernels/policy.cpp
// parse_model_kernels and the kernel_config parser of models/layouts/kernel_config.cpp). Every
// input either parses into values within their documented ranges or throws std::runtime_error
// whose message starts with the file name; anything else is a bug. Seed corpus:
// tests/fuzz/corpus/serving_yaml/ (the example repository's and the tests' serving.yaml files).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "models/registry/family.h"
#include "server/config/serving_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// The torch-free tier links no family, and kernel_config resolves its class names through the
// registered families' layout rules (models/layouts/catalog.cpp): register RT-DETR's rules
// (models/rtdetr/rtdetr.cpp) so that the seed corpus's class names resolve as in the daemon. The
// loader is never called here.
std::unique_ptr<libreyolo::models::Model> no_loader(const std::string& dir, const nlohmann::json&,
                                                    const libreyolo::models::LoadOptions&) {
  throw std::logic_error("serving_yaml_fuzz: no model loads here (" + dir + ")");
}

const libreyolo::models::FamilyRegistrar rtdetr_rules{
    libreyolo::models::Family{"rtdetr", {"rt_detr", "rt_detr_v2"}, /*order=*/10, no_loader}.layouts(
        {{"batchnorm_fold", {"RTDetrConvNormLayer"}, "rt_detr"},
         {"batchnorm_fold", {"RTDetrV2ConvNormLayer"}, "rt_detr_v2"},
         {"batchnorm_fold", {"RTDetrResNetConvLayer"}},
         {"repvgg", {"RTDetrRepVggBlock"}, "rt_detr"},
         {"repvgg", {"RTDetrV2RepVggBlock"}, "rt_detr_v2"},
         {"avgpool_fold", {"AvgPool2d"}},
         {"qkv_concat", {"RTDetrSelfAttention"}, "rt_detr"}},
        {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::server;
  using libreyolo::fuzz::fail;
  const std::string file = "/models/m/serving.yaml";
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ServingConfig c = parse_serving_config(text, file);
    if (c.max_batch_size < 1) fail("max_batch_size " + std::to_string(c.max_batch_size));
    if (!std::isfinite(c.threshold)) fail("threshold not finite");
    if (c.top_k < 0) fail("negative top_k");
    // "" is unset: the server's `dtype` decides (server/instance/dtype_policy.h).
    if (!c.dtype.empty() && c.dtype != "float32" && c.dtype != "float16" && c.dtype != "bfloat16")
      fail("dtype " + c.dtype);
    for (const auto& e : c.kernel_config)
      if (e.value.empty() || e.targets.empty())
        fail("kernel_config entry " + e.key + " without a value or a class");
  } catch (const std::runtime_error& e) {
    libreyolo::fuzz::expect_message(e.what(), file);
  }
  return 0;
}
