// models/core: safetensors validation, strict state-dict loading, config errors; models/layers
// basics. Bad files are generated here, byte by byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/model.h"
#include "tests/support/safetensors_writer.h"

namespace {

namespace core = libreyolo::models::core;
namespace layers = libreyolo::models::layers;

// A scratch folder (mkdtemp). Not std::filesystem: the libtorch.so of the PyPI wheel exports a
// std::filesystem::remove_all that crashes when it wins symbol resolution.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/models_core_test_XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    for (const auto& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  std::string file(const std::string& name, const std::string& bytes) {
    const auto p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    files_.push_back(p);
    return p;
  }
  std::string path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

// 8-byte little-endian length + header + data (tests/support/safetensors_writer.h).
using libreyolo::test::safetensors_bytes;

std::string floats(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) s.append(reinterpret_cast<const char*>(&f), sizeof f);
  return s;
}

// Expects open() to throw CheckpointError with a one-line message containing `needle`.
void expect_open_error(const std::string& path, const std::string& needle) {
  try {
    core::SafetensorsFile::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const core::CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(SafetensorsHeader, TruncatedFile) {
  TempDir dir;
  expect_open_error(dir.file("short.safetensors", std::string("\x05\x00\x00", 3)),
                    "truncated safetensors file: 3 bytes");
}

TEST(SafetensorsHeader, HeaderLengthBeyondFile) {
  TempDir dir;
  std::string bytes = safetensors_bytes("{}", "");
  bytes[0] = static_cast<char>(0xe8), bytes[1] = 0x03;  // 1000
  expect_open_error(dir.file("long.safetensors", bytes),
                    "header length 1000 exceeds the file size 10");
}

TEST(SafetensorsHeader, HeaderLengthHugeDoesNotOverflow) {
  TempDir dir;
  std::string bytes(16, '\xff');
  expect_open_error(dir.file("huge.safetensors", bytes), "header length 18446744073709551615");
}

TEST(SafetensorsHeader, InvalidJson) {
  TempDir dir;
  expect_open_error(dir.file("json.safetensors", safetensors_bytes("{\"w\": [", "")),
                    "header is not valid JSON");
}

TEST(SafetensorsHeader, UnknownDtype) {
  TempDir dir;
  const auto h = R"({"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}})";
  expect_open_error(dir.file("dtype.safetensors", safetensors_bytes(h, floats({1}))),
                    "unknown dtype \"F99\" (tensor 'w')");
}

TEST(SafetensorsHeader, OffsetsOutOfRange) {
  TempDir dir;
  const auto h = R"({"w": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}})";
  expect_open_error(
      dir.file("range.safetensors", safetensors_bytes(h, floats({1, 2}))),
      "data_offsets [0, 400] out of range: the data section has 8 bytes (tensor 'w')");
}

TEST(SafetensorsHeader, OverlappingTensors) {
  TempDir dir;
  const auto h = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  expect_open_error(dir.file("overlap.safetensors", safetensors_bytes(h, floats({1, 2, 3}))),
                    "data of tensor 'b' overlaps tensor 'a' (tensor 'b')");
}

TEST(SafetensorsHeader, ShapeSizeMismatch) {
  TempDir dir;
  const auto h = R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})";
  expect_open_error(dir.file("size.safetensors", safetensors_bytes(h, floats({1, 2}))),
                    "byte size 8 does not match shape [3] x F32 = 12 bytes (tensor 'w')");
}

TEST(SafetensorsHeader, NegativeShapeAndBadEntries) {
  TempDir dir;
  expect_open_error(
      dir.file("neg.safetensors",
               safetensors_bytes(
                   R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", "")),
      "shape entry must be a non-negative integer, found -1 (tensor 'w')");
  expect_open_error(
      dir.file("noshape.safetensors",
               safetensors_bytes(R"({"w": {"dtype": "F32", "data_offsets": [0, 0]}})", "")),
      "missing or non-array 'shape' (tensor 'w')");
  expect_open_error(dir.file("array.safetensors", safetensors_bytes("[1, 2]", "")),
                    "header is not a JSON object");
}

TEST(SafetensorsFile, ReadsValuesZeroCopyAndConverts) {
  TempDir dir;
  const auto h = R"({"__metadata__": {"format": "pt"},
                     "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                     "i": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]}})";
  std::string data = floats({1.5f, -2.0f, 3.25f, 4.0f});
  const int64_t seven = 7;
  data.append(reinterpret_cast<const char*>(&seven), 8);
  const auto path = dir.file("good.safetensors", safetensors_bytes(h, data));
  at::Tensor view;
  {
    const auto file = core::SafetensorsFile::open(path);
    EXPECT_EQ(file->keys(), (std::vector<std::string>{"a", "i"}));
    EXPECT_EQ(file->header().metadata.at("format"), "pt");
    view = file->view("a");
    EXPECT_EQ(file->view("i").item<int64_t>(), 7);
    const auto half = file->get("a", at::kHalf, at::kCPU);
    EXPECT_EQ(half.scalar_type(), at::kHalf);
    EXPECT_EQ(half[1][0].item<float>(), 3.25f);
    try {
      file->view("nope");
      ADD_FAILURE();
    } catch (const core::CheckpointError& e) {
      EXPECT_EQ(std::string(e.what()), path + ": missing tensor (tensor 'nope')");
    }
  }
  // The view keeps the mapping alive after the file object is gone.
  EXPECT_EQ(view.sizes(), (at::IntArrayRef{2, 2}));
  EXPECT_EQ(view[0][1].item<float>(), -2.0f);
  EXPECT_EQ(view[1][1].item<float>(), 4.0f);
}

// A file for a layers::LinearImpl(2 -> 3): weight (rows, 2) = 0, 1, 2, ..., bias (3) when
// `with_bias`, and with `extra` an int64 extra.num_batches_tracked and a float32 surplus (1).
std::string linear_file(TempDir& dir, const std::string& name, bool with_bias, int64_t rows,
                        bool extra) {
  libreyolo::test::NamedTensors t;
  t.emplace_back("weight", at::arange(rows * 2, at::kFloat).view({rows, 2}));
  if (with_bias) t.emplace_back("bias", at::tensor({0.5f, 0.25f, -1.0f}));
  if (extra) {
    t.emplace_back("extra.num_batches_tracked", at::scalar_tensor(0, at::kLong));
    t.emplace_back("surplus", at::tensor({9.0f}));
  }
  return dir.file(name, safetensors_bytes(t));
}

std::string load_error(const std::string& path, torch::nn::Module& m, core::LoadRules rules = {}) {
  const auto file = core::SafetensorsFile::open(path);
  try {
    core::load_state_dict(m, *file, rules, at::kFloat, at::kCPU);
  } catch (const core::CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(StateDict, LoadsStrictlyAndConverts) {
  TempDir dir;
  const auto path = linear_file(dir, "ok.safetensors", true, 3, false);
  layers::LinearImpl linear(2, 3);
  const auto file = core::SafetensorsFile::open(path);
  const auto report = core::load_state_dict(linear, *file, {}, at::kHalf, at::kCPU);
  EXPECT_EQ(report.loaded, 2u);
  EXPECT_EQ(linear.weight.scalar_type(), at::kHalf);
  EXPECT_FALSE(linear.weight.requires_grad());
  EXPECT_EQ(linear.weight[2][1].item<float>(), 5.0f);
  EXPECT_EQ(linear.bias[2].item<float>(), -1.0f);
  // forward on the loaded values: x = (1, 1) -> row sums + bias.
  const auto y = linear.forward(at::ones({1, 2}, at::kHalf));
  EXPECT_EQ(y[0][0].item<float>(), 1.5f);
}

TEST(StateDict, MissingKey) {
  TempDir dir;
  const auto path = linear_file(dir, "missing.safetensors", false, 3, false);
  layers::LinearImpl linear(2, 3);
  const auto msg = load_error(path, linear);
  EXPECT_NE(msg.find(path + ": checkpoint does not match the model: missing keys (1): bias"),
            std::string::npos)
      << msg;
}

TEST(StateDict, UnexpectedKeyButNumBatchesTrackedIgnored) {
  TempDir dir;
  const auto path = linear_file(dir, "unexpected.safetensors", true, 3, true);
  layers::LinearImpl linear(2, 3);
  const auto msg = load_error(path, linear);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected keys (1): surplus"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("num_batches_tracked"), std::string::npos) << msg;
  // Declared as ignorable: loads.
  core::LoadRules rules;
  rules.ignored_file_keys = {"surp.*"};
  EXPECT_EQ(load_error(path, linear, rules), "");
}

TEST(StateDict, WrongShapeNamesKeyAndShapes) {
  TempDir dir;
  const auto path = linear_file(dir, "shape.safetensors", true, 2, false);
  layers::LinearImpl linear(2, 3);
  const auto before = linear.weight.clone();
  const auto msg = load_error(path, linear);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape mismatch for 'weight': expected [3, 2], found [2, 2]"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_TRUE(linear.weight.sizes() == before.sizes());  // nothing modified
}

/// A checkpoint key with control characters (JSON's "\n" in a name; the safetensors_file fuzz
/// target found one) is echoed with them escaped: the message stays one line.
TEST(StateDict, ControlCharactersOfAFileKeyAreEscaped) {
  TempDir dir;
  libreyolo::test::NamedTensors t;
  t.emplace_back("weight", at::zeros({3, 2}));
  t.emplace_back("bias", at::zeros({3}));
  t.emplace_back("sur\nplus\x01", at::tensor({9.0f}));
  const auto path = dir.file("newline.safetensors", safetensors_bytes(t));
  layers::LinearImpl linear(2, 3);
  EXPECT_EQ(load_error(path, linear),
            path + ": checkpoint does not match the model: unexpected keys (1): sur\\x0aplus\\x01");
}

TEST(StateDict, AliasesAndAllProblemsInOneMessage) {
  TempDir dir;
  const auto path = linear_file(dir, "alias.safetensors", false, 3, true);
  auto root = std::make_shared<torch::nn::Module>();
  root->register_module("head", std::make_shared<layers::LinearImpl>(2, 3));
  root->register_module("other", std::make_shared<layers::LinearImpl>(1, 1));
  core::LoadRules rules;
  rules.aliases = [](const std::string& k) {
    return std::vector<std::string>{k.substr(k.find('.') + 1)};  // head.weight -> weight
  };
  const auto msg = load_error(path, *root, rules);
  // head.weight and other.weight resolve through the alias "weight" (other's has the wrong
  // shape); the biases are missing; surplus is unexpected: all in one line.
  EXPECT_NE(msg.find(path + ": checkpoint does not match the model: missing keys (2): head.bias, "
                            "other.bias; unexpected keys (1): surplus; shape mismatch for "
                            "'other.weight': expected [1, 1], found [3, 2] (from 'weight')"),
            std::string::npos)
      << msg;
}

TEST(Config, ErrorsNameFileAndField) {
  const nlohmann::json j = nlohmann::json::parse(
      R"({"d_model": "big", "backbone_config": {"depths": [1, "x"]}, "eps": null, "f": 2.0})");
  const core::ConfigView cfg(j, "/m/config.json");
  EXPECT_EQ(cfg.get_int("f"), 2);
  EXPECT_EQ(cfg.get_double("eps", 1e-5), 1e-5);  // null = absent
  try {
    cfg.get_int("d_model");
    ADD_FAILURE();
  } catch (const core::ConfigError& e) {
    EXPECT_STREQ(e.what(), "/m/config.json: field 'd_model': expected an integer, found \"big\"");
  }
  try {
    cfg.child("backbone_config").get_int_list("depths");
    ADD_FAILURE();
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/m/config.json: field 'backbone_config.depths'"),
              std::string::npos);
  }
  EXPECT_THROW(cfg.get_string("missing"), core::ConfigError);
}

TEST(LoadModel, UnknownModelTypeAndUnsupportedOption) {
  TempDir dir;
  dir.file("config.json", R"({"model_type": "yolo_nas"})");
  try {
    libreyolo::models::load_model(dir.path());
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), dir.path() +
                                         "/config.json: field 'model_type': unsupported model "
                                         "type \"yolo_nas\"");
  }
  dir.file("config.json", R"({"model_type": "rt_detr_v2", "decoder_method": "nearest"})");
  try {
    libreyolo::models::load_model(dir.path());
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/config.json: field 'decoder_method': unsupported "
                                         "value \"nearest\""),
              std::string::npos)
        << e.what();
  }
  dir.file("config.json", R"({"model_type": "rt_detr", "learn_initial_query": true})");
  EXPECT_THROW(libreyolo::models::load_model(dir.path()), core::ConfigError);
  EXPECT_THROW(libreyolo::models::load_model(dir.path() + "/nowhere"), core::ConfigError);
}

TEST(Layers, FrozenBatchNormFormula) {
  layers::FrozenBatchNorm2dImpl bn(2);
  bn.weight.copy_(at::tensor({2.0f, 0.5f}));
  bn.bias.copy_(at::tensor({1.0f, -1.0f}));
  bn.running_mean.copy_(at::tensor({0.5f, 2.0f}));
  bn.running_var.copy_(at::tensor({4.0f, 0.25f}));
  const auto x = at::arange(8, at::kFloat).reshape({1, 2, 2, 2});
  const auto scale = at::tensor({2.0f, 0.5f}) * (at::tensor({4.0f, 0.25f}) + 1e-5).rsqrt();
  const auto shift = at::tensor({1.0f, -1.0f}) - at::tensor({0.5f, 2.0f}) * scale;
  const auto expected = x * scale.reshape({1, 2, 1, 1}) + shift.reshape({1, 2, 1, 1});
  EXPECT_TRUE(at::equal(bn.forward(x), expected));
}

TEST(Layers, AttentionManualVsFusedAndFlagWalker) {
  layers::AttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  auto root = std::make_shared<torch::nn::Module>();
  auto a = root->register_module("attn", std::make_shared<layers::AttentionImpl>(o));
  at::manual_seed(0);
  for (auto& p : root->parameters()) p.detach().normal_(0, 0.3);
  const auto x = at::randn({2, 5, 8});
  const auto bias = at::randn({1, 2, 5, 5});
  at::NoGradGuard g;
  const auto manual = a->forward(x, x, x, bias);
  // Reference: explicit per-head math.
  auto q = a->q_proj->forward(x).view({2, 5, 2, 4}).transpose(1, 2);
  auto k = a->k_proj->forward(x).view({2, 5, 2, 4}).transpose(1, 2);
  auto v = a->v_proj->forward(x).view({2, 5, 2, 4}).transpose(1, 2);
  auto w = at::softmax(at::matmul(q, k.transpose(2, 3)) * 0.5 + bias, -1);
  auto ref = a->o_proj->forward(at::matmul(w, v).transpose(1, 2).reshape({2, 5, 8}));
  EXPECT_TRUE(at::allclose(manual, ref, 0, 1e-6));
  EXPECT_EQ(layers::set_fused_attention(*root, true), 1);
  EXPECT_EQ(layers::set_fused_attention(*root, true), 0);
  const auto fused = a->forward(x, x, x, bias);
  const double diff = (fused - manual).abs().max().item<double>();
  std::cout << "[unit] attention fused vs manual max|diff| = " << diff << std::endl;
  EXPECT_LE(diff, 1e-5);
}

}  // namespace
