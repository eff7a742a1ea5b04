// libreyolo-predict as a program: usage errors exit 2 with the usage text, runtime errors exit 1
// naming the problem, and an RT-DETR run on a fixture JPEG reproduces transformers'
// post_process_object_detection. Skipped when the tool is not built (ninja libreyolo-predict).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "models/core/safetensors.h"

namespace {

namespace fs = std::filesystem;
const fs::path kTool = fs::path(LIBREYOLO_BINARY_DIR) / "bin" / "libreyolo-predict";
const fs::path kFixtures = LIBREYOLO_TEST_FIXTURES;

struct ToolRun {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ToolRun run_tool(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("image_predict_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string cmd = "LIBREYOLO_HUB_KERNELS=0 '" + kTool.string() + "' " + args + " >'" +
                          (dir / "out").string() + "' 2>'" + (dir / "err").string() + "'";
  ToolRun r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  return r;
}

class PredictTool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kTool)) GTEST_SKIP() << kTool << " is not built";
  }
};

TEST_F(PredictTool, UsageErrorsExit2) {
  // Each run loads LibTorch (~1 s): a few representative cases.
  for (const std::string args : {"", "--bogus", "--model m --image a.jpg --pixels p.safetensors",
                                 "--model m --image a.jpg --dtype float64"}) {
    const ToolRun r = run_tool(args);
    EXPECT_EQ(r.rc, 2) << args;
    EXPECT_NE(r.err.find("usage: libreyolo-predict"), std::string::npos) << args << ": " << r.err;
  }
  const ToolRun r = run_tool("--model m --image a.jpg --threshold abc");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("invalid value for --threshold"), std::string::npos) << r.err;
}

TEST_F(PredictTool, RuntimeErrorsExit1WithMessage) {
  const ToolRun r = run_tool("--model /nonexistent/model --image a.jpg");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("libreyolo-predict: error: /nonexistent/model"), std::string::npos) << r.err;
}

TEST_F(PredictTool, RtDetrOnFixtureJpegMatchesTransformers) {
  const fs::path model = kFixtures / "models" / "rtdetr_tiny";
  if (!fs::exists(model / "model.safetensors")) GTEST_SKIP() << "no rtdetr_tiny weights";
  // A corrupt image is a runtime error naming the file.
  const fs::path bad = fs::temp_directory_path() / "image_predict_bad.jpg";
  std::ofstream(bad) << "\xFF\xD8\xFF garbage";
  const ToolRun rb = run_tool("--model '" + model.string() + "' --image '" + bad.string() + "'");
  EXPECT_EQ(rb.rc, 1);
  EXPECT_NE(rb.err.find(bad.string() + ": corrupt JPEG header"), std::string::npos) << rb.err;

  // meta.json: images [astronaut, coffee]; coffee.jpg is image 1 of the fixture batch.
  const fs::path out = fs::temp_directory_path() / "image_predict_rtdetr.safetensors";
  const ToolRun r = run_tool("--model '" + model.string() + "' --image '" +
                             (kFixtures / "images" / "coffee.jpg").string() +
                             "' --threshold 0.3 --out '" + out.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  // WxH (coffee.jpg is 600 wide, 400 high), the convention of the error messages.
  EXPECT_NE(r.out.find("coffee.jpg (600x400): 30 detections with score > 0.3"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ms_deform_attn ->"), std::string::npos) << "kernel table missing";
  auto got = libreyolo::models::core::SafetensorsFile::open(out.string());
  auto want =
      libreyolo::models::core::SafetensorsFile::open((model / "expected.safetensors").string());
  const at::Tensor s = want->view("th0.3_img1_scores");
  ASSERT_EQ(got->view("img0_scores").numel(), s.numel());
  EXPECT_TRUE(at::equal(got->view("img0_labels"), want->view("th0.3_img1_labels")));
  const double ds = (got->view("img0_scores") - s).abs().max().item<double>();
  const double db =
      (got->view("img0_boxes") - want->view("th0.3_img1_boxes")).abs().max().item<double>();
  std::cout << "libreyolo-predict rtdetr_tiny coffee.jpg: max |score| " << ds << ", max |box| "
            << db << " px\n";
  EXPECT_LE(ds, 1e-4);
  EXPECT_LE(db, 1e-2);
}

TEST_F(PredictTool, GroundingDinoPromptMatchesTransformers) {
  // --prompt drives a text-conditioned detector: chelsea.jpg with the fixture's merged label list
  // at its box/text thresholds gives post_process_grounded_object_detection's boxes and phrases
  // (tests/fixtures/models/grounding_dino_tiny, case "labels"); a prompt is required.
  const fs::path model = kFixtures / "models" / "grounding_dino_tiny";
  const std::string image = (kFixtures / "images" / "chelsea.jpg").string();
  const ToolRun missing = run_tool("--model '" + model.string() + "' --image '" + image + "'");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("grounding-dino is text-conditioned: give --prompt"),
            std::string::npos)
      << missing.err;
  const fs::path out = fs::temp_directory_path() / "image_predict_grounding_dino.safetensors";
  const ToolRun r = run_tool("--model '" + model.string() + "' --image '" + image +
                             "' --prompt 'a cat. a dog. remote control.' --threshold 0.261001"
                             " --text-threshold 0.197509 --out '" +
                             out.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("chelsea.jpg (451x300): 6 detections with score > 0.261001"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  a cat a. remote control [SEP] 0.8215"), std::string::npos) << r.out;
  auto got = libreyolo::models::core::SafetensorsFile::open(out.string());
  auto want =
      libreyolo::models::core::SafetensorsFile::open((model / "expected.safetensors").string());
  const at::Tensor s = want->view("labels_img0_scores");
  ASSERT_EQ(got->view("img0_scores").numel(), s.numel());
  EXPECT_LE((got->view("img0_scores") - s).abs().max().item<double>(), 1e-4);
  EXPECT_LE((got->view("img0_boxes") - want->view("labels_img0_boxes")).abs().max().item<double>(),
            1e-2);
  EXPECT_TRUE(at::equal(got->view("input_ids"), want->view("labels_input_ids")));
}

TEST_F(PredictTool, OwlPromptMatchesTransformers) {
  // --prompt gives OWLv2 its labels (split at '.'): astronaut.jpg with the fixture's first
  // image's labels at threshold 0.1 gives post_process_grounded_object_detection's boxes, labels
  // and scores (tests/fixtures/models/owlv2_tiny, th0.1_img0), and the raw objectness logits.
  const fs::path model = kFixtures / "models" / "owlv2_tiny";
  const std::string image = (kFixtures / "images" / "astronaut.jpg").string();
  const fs::path out = fs::temp_directory_path() / "image_predict_owlv2.safetensors";
  const ToolRun r = run_tool("--model '" + model.string() + "' --image '" + image +
                             "' --prompt 'a photo of an astronaut. a flag. a cup of coffee.'"
                             " --threshold 0.1 --out '" +
                             out.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto got = libreyolo::models::core::SafetensorsFile::open(out.string());
  auto want =
      libreyolo::models::core::SafetensorsFile::open((model / "expected.safetensors").string());
  const at::Tensor s = want->view("th0.1_img0_scores");
  ASSERT_EQ(got->view("img0_scores").numel(), s.numel());
  EXPECT_NE(r.out.find("astronaut.jpg (512x512): " + std::to_string(s.numel()) +
                       " detections with score > 0.1"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(at::equal(got->view("img0_labels"), want->view("th0.1_img0_labels")));
  EXPECT_LE((got->view("img0_scores") - s).abs().max().item<double>(), 1e-4);
  EXPECT_LE((got->view("img0_boxes") - want->view("th0.1_img0_boxes")).abs().max().item<double>(),
            1e-2);
  EXPECT_EQ(got->view("objectness_logits").sizes(), (at::IntArrayRef{1, 16}));
  // (B, Q, L): the image's three labels, the fixture's first three rows.
  EXPECT_TRUE(at::equal(got->view("input_ids")[0], want->view("input_ids").slice(0, 0, 3)));
}

TEST_F(PredictTool, ModelFolderRunsItsHighestNumericVersion) {
  // <dir>/9 is empty (not a checkpoint) and <dir>/10 the fixture: the highest version is 10
  // numerically (9 as text); "010" and "x" are not versions.
  const fs::path model = kFixtures / "models" / "rtdetr_tiny";
  if (!fs::exists(model / "model.safetensors")) GTEST_SKIP() << "no rtdetr_tiny weights";
  const fs::path dir =
      fs::temp_directory_path() / ("image_predict_repo_" + std::to_string(::getpid()));
  fs::create_directories(dir / "rtdetr" / "9");
  fs::create_directories(dir / "rtdetr" / "010");
  fs::create_directories(dir / "rtdetr" / "x");
  fs::create_directory_symlink(model, dir / "rtdetr" / "10");
  const std::string image = (kFixtures / "images" / "coffee.jpg").string();
  const ToolRun r = run_tool("--model '" + (dir / "rtdetr").string() + "' --image '" + image +
                             "' --threshold 0.3");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("model " + (dir / "rtdetr").string() + ": highest version " +
                       (dir / "rtdetr" / "10").string() + "\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("coffee.jpg (600x400): 30 detections with score > 0.3"), std::string::npos)
      << r.out;
  // A folder with neither: exit 1 naming it.
  const ToolRun e =
      run_tool("--model '" + (dir / "rtdetr" / "x").string() + "' --image '" + image + "'");
  EXPECT_EQ(e.rc, 1);
  EXPECT_NE(e.err.find("libreyolo-predict: error: " + (dir / "rtdetr" / "x").string() +
                       ": no config.json and no numeric version folder"),
            std::string::npos)
      << e.err;
  ::unlink((dir / "rtdetr" / "10").c_str());
  for (const char* d : {"9", "010", "x"}) ::rmdir((dir / "rtdetr" / d).c_str());
  ::rmdir((dir / "rtdetr").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
