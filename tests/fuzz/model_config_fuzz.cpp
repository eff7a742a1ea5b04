// libFuzzer target: the model configuration readers of a checkpoint folder. A JSON object with
// "image_processor_type" is read as preprocessor_config.json (models/image/processor.cpp
// ProcessorConfig::from_json; then the processor's output_size() for a few image sizes, what the
// core's pixel limit and warm-up use); any other input as config.json: the core's JSON reader
// (models/core/config.cpp parse_json_text, ConfigView) and, by model_type, the family parsers
// RT-DETR / RT-DETRv2 (rtdetr::Config::parse) and D-FINE (dfine::Config::parse). Every input
// either parses or throws std::runtime_error (ConfigError) naming the file; crashes, sanitizer
// reports (overflowing size arithmetic included) and other exceptions are bugs. Seed corpus:
// tests/fuzz/corpus/config_json/ (every fixture's config.json and preprocessor_config.json).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "models/core/config.h"
#include "models/dfine/modules.h"
#include "models/image/processor.h"
#include "models/rtdetr/modules.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo;
  using fuzz::fail;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool processor = text.find("\"image_processor_type\"") != std::string::npos;
  if (processor) {
    const std::string file = "/models/m/1/preprocessor_config.json";
    try {
      const image::ImageProcessor p(image::ProcessorConfig::from_json(text, file));
      for (const auto& [h, w] :
           {std::pair<int64_t, int64_t>{480, 640}, {1, 40000}, {40000, 1}, {1, 1}, {8192, 8192}}) {
        try {
          const auto [oh, ow] = p.output_size(h, w);
          (void)oh;
          (void)ow;
        } catch (const c10::ValueError& e) {
          // An image size the processor cannot resize (YOLOS floors sides to multiples of 16):
          // the server answers that image INVALID_ARGUMENT; the message names the processor.
          const std::string m = e.what_without_backtrace();
          if (m.find("ImageProcessor: ") == std::string::npos)
            fail("an output size error that does not name the processor: " + m);
        }
      }
    } catch (const std::runtime_error& e) {
      fuzz::expect_message(e.what(), file);
    }
    return 0;
  }
  const std::string file = "/models/m/1/config.json";
  try {
    const nlohmann::json json = models::core::parse_json_text(text, file);
    const models::core::ConfigView view(json, file);
    const std::string type = view.get_string("model_type", "");
    if (type == "rt_detr" || type == "rt_detr_v2") (void)models::rtdetr::Config::parse(view);
    if (type == "d_fine") (void)models::dfine::Config::parse(view);
  } catch (const models::core::ConfigError& e) {
    fuzz::expect_message(e.what(), file);
  }
  return 0;
}
