// models/core read_json_file: the 16 MiB cap on config.json / preprocessor_config.json and the
// clipping of huge tokens that nlohmann's parse errors quote whole. Files generated here.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>
#include <functional>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "models/core/config.h"

namespace {

namespace core = libreyolo::models::core;

/// A file under /tmp removed at the end of the test (not std::filesystem: see models_core_test).
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    std::string tmpl = "/tmp/models_core_json_test_XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd >= 0) ::close(fd);
    path_ = tmpl;
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string error_of(const std::string& path) {
  try {
    core::read_json_file(path);
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModelsCoreJson, FileOverSixteenMebibytesIsRefusedBeforeParsing) {
  // 17 MiB of valid JSON: the size alone refuses it.
  const std::int64_t size = std::int64_t{17} << 20;
  std::string text = "{\"pad\": \"" + std::string(size - 12, 'x') + "\"}";
  text.resize(static_cast<std::size_t>(size), ' ');
  TempFile f(text);
  struct stat st {};
  ASSERT_EQ(::stat(f.path().c_str(), &st), 0);
  ASSERT_EQ(st.st_size, 17825792);
  EXPECT_EQ(error_of(f.path()), f.path() +
                                    ": 17825792 bytes, more than the 16777216 (16 MiB) a JSON "
                                    "configuration file may have");
  // Exactly at the cap: read and parsed.
  text.resize(static_cast<std::size_t>(core::kMaxJsonFileBytes));
  text[text.size() - 1] = '}';
  text[text.size() - 2] = '"';
  TempFile at_cap(text);
  EXPECT_EQ(core::read_json_file(at_cap.path())["pad"].get<std::string>().size(), 16777205u);
}

TEST(ModelsCoreJson, HugeTokenInTheParseErrorIsClipped) {
  // One 3 MB number token: nlohmann's out_of_range.406 message quotes it whole.
  const std::string token = "1" + std::string(3000000, '0');
  TempFile f("{\"num_queries\": " + token + "}");
  const auto what = error_of(f.path());
  std::cout << "message (" << what.size() << " characters): " << what << "\n";
  EXPECT_EQ(what, f.path() +
                      ": invalid JSON: [json.exception.out_of_range.406] number overflow parsing "
                      "'1" +
                      std::string(47, '0') + "...' (3000001 characters)");
  EXPECT_LT(what.size(), 300u);
  // A 3 MB string ending in a raw control character: the syntax error's "last read: '...'"
  // quotes the whole string token (the control character printed as "<U+0001>": 1 + 3000000 + 8
  // characters) and is clipped the same way.
  TempFile g("{\"a\": \"" + std::string(3000000, 'x') + "\x01\"}");
  const auto syntax = error_of(g.path());
  std::cout << "message (" << syntax.size() << " characters): " << syntax << "\n";
  EXPECT_EQ(syntax.rfind(g.path() + ": invalid JSON: [json.exception.parse_error.101] parse error "
                                    "at line 1, column ",
                         0),
            0u)
      << syntax;
  EXPECT_NE(syntax.find("last read: '\"" + std::string(47, 'x') + "...' (3000009 characters)"),
            std::string::npos)
      << syntax;
  EXPECT_LT(syntax.size(), 400u);
}

TEST(ModelsCoreJson, ClipKeepsShortTokensAndJoinsLines) {
  EXPECT_EQ(core::clip_json_error("a 'short' b\nc"), "a 'short' b c");
  EXPECT_EQ(core::clip_json_error("x '" + std::string(65, 'y') + "' z"),
            "x '" + std::string(48, 'y') + "...' (65 characters) z");
  EXPECT_EQ(core::clip_json_error("x '" + std::string(64, 'y') + "'"),
            "x '" + std::string(64, 'y') + "'");
  // Unterminated: clipped to the end of the message.
  EXPECT_EQ(core::clip_json_error("x '" + std::string(100, 'y')),
            "x '" + std::string(48, 'y') + "...' (100 characters)");
  EXPECT_EQ(core::clip_json_error(std::string(5000, 'a')).size(), 1024u);
}

TEST(ModelsCoreJson, MissingFileAndFifo) {
  EXPECT_EQ(error_of("/nonexistent/config.json"), "/nonexistent/config.json: cannot open");
  // Not a regular file: no size to check first, read up to one byte past the cap.
  EXPECT_EQ(error_of("/dev/zero"),
            "/dev/zero: at least 16777217 bytes, more than the 16777216 (16 MiB) a JSON "
            "configuration file may have");
}

}  // namespace

namespace {

// config_json_fuzz: a key holding a newline made a two-line error message
// (tests/fuzz/corpus/config_json/regress-newline-key.json).
TEST(ModelsCoreJson, FieldNamesInErrorsAreOneLine) {
  const auto j = nlohmann::json::parse(R"({"do_convert_\nnotations": true})");
  const core::ConfigView view(j, "/repo/m/1/config.json");
  try {
    (void)view.get_int("do_convert_\nnotations");
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "/repo/m/1/config.json: field 'do_convert_\\x0anotations': expected an integer, "
              "found true");
  }
}

// config_json_fuzz's campaign (docs/FUZZING.md): an enum value holding a newline was echoed raw; it
// is now the value as JSON, escaped and clipped (tests/fuzz/corpus/config_json/
// regress-newline-in-enum-value.json). id2label keys likewise.
TEST(ModelsCoreJson, ValuesInErrorsAreOneLineAndClipped) {
  const auto j =
      nlohmann::json::parse(R"({"model_type": "rt_\ndetr", "long": ")" + std::string(100, 'x') +
                            R"(", "id2label": {"a\nb": "cat"}})");
  const core::ConfigView view(j, "/repo/m/1/config.json");
  auto error = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error([&] { (void)view.get_enum("model_type", "", {"rt_detr"}); }),
            "/repo/m/1/config.json: field 'model_type': unsupported value \"rt_\\ndetr\" "
            "(supported: \"rt_detr\")");
  EXPECT_EQ(error([&] { (void)view.get_enum("long", "", {"a"}); }),
            "/repo/m/1/config.json: field 'long': unsupported value \"" + std::string(56, 'x') +
                "... (supported: \"a\")");
  EXPECT_EQ(error([&] { (void)view.id2label(); }),
            "/repo/m/1/config.json: field 'id2label': key \"a\\nb\" is not an integer");
}

}  // namespace
