// The text tokenizers of models/text/ against transformers 5.17 (tests/fixtures/tokenizers,
// made by make_fixtures.py): BertTokenizer (WordPiece) and ClipTokenizer (byte-level BPE), every
// committed string's input_ids, the padded batches' ids and attention masks, both ways of loading
// a folder (tokenizer.json; vocab.txt / vocab.json + merges.txt), and the exact error messages.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/text/bert_tokenizer.h"
#include "models/text/clip_tokenizer.h"

namespace {

using libreyolo::models::core::ConfigError;
using libreyolo::models::text::BertTokenizer;
using libreyolo::models::text::ClipTokenizer;
using libreyolo::models::text::Encoding;
using libreyolo::models::text::Padding;
using Ids = std::vector<std::int64_t>;

const std::string kDir = std::string(LIBREYOLO_TEST_FIXTURES) + "/tokenizers";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

const nlohmann::json& strings() {
  static const nlohmann::json s = read_json(kDir + "/strings.json");
  return s;
}

const nlohmann::json& expected() {
  static const nlohmann::json e = read_json(kDir + "/expected.json");
  return e;
}

// A fresh folder under $TMPDIR (removed with its files by the destructor).
struct TempDir {
  std::string path;
  std::vector<std::string> files;
  TempDir() {
    std::string templ =
        (getenv("TMPDIR") ? std::string(getenv("TMPDIR")) : "/tmp") + "/tokenizer_test.XXXXXX";
    path = mkdtemp(templ.data());
  }
  ~TempDir() {
    for (const std::string& f : files) unlink((path + "/" + f).c_str());
    rmdir(path.c_str());
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(path + "/" + name, std::ios::binary) << text;
    files.push_back(name);
  }
  void copy(const std::string& from_dir, const std::string& name) {
    std::ifstream in(from_dir + "/" + name, std::ios::binary);
    write(name, std::string(std::istreambuf_iterator<char>(in), {}));
  }
};

template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

template <class Tokenizer>
void expect_fixture_ids(const Tokenizer& tokenizer, const std::string& name) {
  const nlohmann::json& e = expected()[name];
  const auto max_length = e["max_length"].get<std::int64_t>();
  ASSERT_EQ(tokenizer.model_max_length(), max_length);
  ASSERT_EQ(e["input_ids"].size(), strings().size());
  ASSERT_GE(strings().size(), 2000u);
  int truncated = 0;
  for (std::size_t i = 0; i < strings().size(); ++i) {
    const std::string text = strings()[i];
    const Encoding got = tokenizer.encode(text);
    EXPECT_EQ(got.ids, e["input_ids"][i].get<Ids>()) << name << " string " << i << ": " << text;
    EXPECT_EQ(got.attention_mask, Ids(got.ids.size(), 1));
    EXPECT_LE(static_cast<std::int64_t>(got.ids.size()), max_length);
    truncated += static_cast<std::int64_t>(got.ids.size()) == max_length;
  }
  EXPECT_GT(truncated, 20);  // the long strings do reach the truncation
}

template <class Tokenizer>
void expect_padded_batches(const Tokenizer& tokenizer, const std::string& name) {
  std::vector<std::string> batch;
  for (const auto& i : expected()["batch_indices"]) batch.push_back(strings()[i.get<int>()]);
  ASSERT_GE(batch.size(), 40u);
  for (const auto& [mode, padding] :
       {std::pair{"max_length", Padding::kMaxLength}, std::pair{"longest", Padding::kLongest}}) {
    const nlohmann::json& e = expected()[name]["padded_batch"][mode];
    const std::vector<Encoding> got = tokenizer.encode_batch(batch, padding);
    ASSERT_EQ(got.size(), batch.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].ids, e["input_ids"][i].get<Ids>()) << mode << " " << batch[i];
      EXPECT_EQ(got[i].attention_mask, e["attention_mask"][i].get<Ids>())
          << mode << " " << batch[i];
    }
  }
}

TEST(BertTokenizer, EveryFixtureStringMatchesTransformers) {
  expect_fixture_ids(BertTokenizer::from_folder(kDir + "/bert_tiny"), "bert_tiny");
}

TEST(BertTokenizer, VocabTxtWithoutTokenizerJsonGivesTheSameIds) {
  TempDir dir;
  for (const char* f : {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"})
    dir.copy(kDir + "/bert_tiny", f);
  expect_fixture_ids(BertTokenizer::from_folder(dir.path), "bert_tiny");
}

TEST(BertTokenizer, CasedConfigMatchesTransformers) {
  const BertTokenizer tokenizer = BertTokenizer::from_folder(kDir + "/bert_tiny_cased");
  const nlohmann::json& e = expected()["bert_tiny_cased"];
  ASSERT_GT(e["indices"].size(), 200u);
  for (std::size_t k = 0; k < e["indices"].size(); ++k) {
    const std::string text = strings()[e["indices"][k].get<int>()];
    EXPECT_EQ(tokenizer.encode(text).ids, e["input_ids"][k].get<Ids>()) << text;
  }
}

TEST(BertTokenizer, PaddedBatchesMatchTransformers) {
  expect_padded_batches(BertTokenizer::from_folder(kDir + "/bert_tiny"), "bert_tiny");
}

TEST(BertTokenizer, GroundingDinoPromptPieces) {
  const BertTokenizer tokenizer = BertTokenizer::from_folder(kDir + "/bert_tiny");
  // transformers: BertTokenizer.from_pretrained("bert_tiny").tokenize(...) and input_ids.
  EXPECT_EQ(tokenizer.tokenize("a cat. a remote control."),
            (std::vector<std::string>{"a", "cat", ".", "a", "remote", "control", "."}));
  EXPECT_EQ(tokenizer.encode("a cat. a remote control.").ids,
            (Ids{2, 43, 1586, 18, 43, 1849, 1851, 18, 3}));
  EXPECT_EQ(tokenizer.tokenize("Grüße, İstanbul! 猫"),
            (std::vector<std::string>{"g", "##ru", "##ß", "##e", ",", "is", "##t", "##an", "##b",
                                      "##ul", "!", "猫"}));
  EXPECT_EQ(tokenizer.encode("it's 2026").ids, (Ids{2, 1049, 11, 61, 22, 640, 623, 687, 3}));
  EXPECT_EQ(tokenizer.vocab_size(), 2000);
  EXPECT_EQ(tokenizer.pad_id(), 0);
}

TEST(ClipTokenizer, EveryFixtureStringMatchesTransformers) {
  expect_fixture_ids(ClipTokenizer::from_folder(kDir + "/clip_tiny"), "clip_tiny");
}

TEST(ClipTokenizer, VocabJsonAndMergesTxtGiveTheSameIds) {
  TempDir dir;
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    dir.copy(kDir + "/clip_tiny", f);
  expect_fixture_ids(ClipTokenizer::from_folder(dir.path), "clip_tiny");
}

TEST(ClipTokenizer, PaddedBatchesMatchTransformers) {
  expect_padded_batches(ClipTokenizer::from_folder(kDir + "/clip_tiny"), "clip_tiny");
}

TEST(ClipTokenizer, PromptTokens) {
  const ClipTokenizer tokenizer = ClipTokenizer::from_folder(kDir + "/clip_tiny");
  // transformers: CLIPTokenizer.from_pretrained("clip_tiny").tokenize(...) and input_ids.
  EXPECT_EQ(tokenizer.tokenize("a cat. a remote control."),
            (std::vector<std::string>{"a</w>", "cat</w>", ".</w>", "a</w>", "remote</w>",
                                      "control</w>", ".</w>"}));
  EXPECT_EQ(tokenizer.encode("a cat. a remote control.").ids,
            (Ids{2108, 320, 1156, 269, 320, 1429, 1638, 269, 2109}));
  EXPECT_EQ(tokenizer.encode("it's 2026").ids, (Ids{2108, 582, 749, 273, 271, 273, 277, 2109}));
  EXPECT_EQ(tokenizer.encode("Grüße, İstanbul! 猫").ids,
            (Ids{2108, 1831, 1835, 1769, 267, 328, 136, 485, 707, 609, 331, 256, 616, 360, 2109}));
  EXPECT_EQ(tokenizer.vocab_size(), 2110);
  EXPECT_EQ(tokenizer.pad_id(), 2109);  // <|endoftext|>
}

TEST(ClipTokenizer, OwlVitPadTokenIsAnAddedToken) {
  // OWL-ViT's tokenizer_config.json names pad_token "!": transformers then matches "!" in the
  // text as that special token (CLIPTokenizer.from_pretrained("clip_tiny", pad_token="!")("hi!!")
  // is [2108, 71, 328, 0, 0, 2109], without it [2108, 71, 328, 0, 256, 2109]).
  TempDir dir;
  dir.copy(kDir + "/clip_tiny", "vocab.json");
  dir.copy(kDir + "/clip_tiny", "merges.txt");
  dir.write("tokenizer_config.json", R"({"model_max_length": 16, "pad_token": "!"})");
  const ClipTokenizer owl = ClipTokenizer::from_folder(dir.path);
  EXPECT_EQ(owl.encode("hi!!").ids, (Ids{2108, 71, 328, 0, 0, 2109}));
  EXPECT_EQ(ClipTokenizer::from_folder(kDir + "/clip_tiny").encode("hi!!").ids,
            (Ids{2108, 71, 328, 0, 256, 2109}));
  const std::vector<Encoding> padded = owl.encode_batch({"hi"}, Padding::kMaxLength);
  EXPECT_EQ(padded[0].ids, (Ids{2108, 71, 328, 2109, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(padded[0].attention_mask, (Ids{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(Tokenizer, ExplicitMaxLengthAndNoModelMaxLength) {
  TempDir dir;
  dir.copy(kDir + "/bert_tiny", "vocab.txt");
  const BertTokenizer tokenizer = BertTokenizer::from_folder(dir.path);  // no tokenizer_config
  EXPECT_EQ(tokenizer.model_max_length(), 0);
  const std::string text(500, 'a');
  EXPECT_EQ(tokenizer.encode(std::string(50, ' ') + "a b c d e").ids.size(), 7u);
  EXPECT_EQ(tokenizer.encode(text + " " + text + " a a a").ids.size(), 7u);
  EXPECT_EQ(tokenizer.encode("a b c d e", 4).ids, (Ids{2, 43, 44, 3}));
  EXPECT_THROW(tokenizer.encode_batch({"a"}, Padding::kMaxLength), std::invalid_argument);
  EXPECT_THROW(tokenizer.encode("a", 1), std::invalid_argument);
}

TEST(Tokenizer, MissingVocabularyFiles) {
  TempDir dir;
  EXPECT_EQ(config_error([&] { BertTokenizer::from_folder(dir.path); }),
            dir.path + "/vocab.txt: cannot open");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path + "/vocab.json: cannot open");
  dir.copy(kDir + "/clip_tiny", "vocab.json");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path + "/merges.txt: cannot open");
}

TEST(Tokenizer, MalformedMergesLine) {
  TempDir dir;
  dir.write("vocab.json", R"({"a": 0, "b": 1, "ab": 2, "<|startoftext|>": 3, "<|endoftext|>": 4})");
  dir.write("merges.txt", "#version: 0.2\na b\na b c\n");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path + "/merges.txt:3: expected two symbols separated by one space, found 'a b c'");
  dir.write("merges.txt", "#version: 0.2\nb a\n");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path + "/merges.txt:2: merge 'b a': 'ba' is not in the vocabulary");
  dir.write("merges.txt", "a b\n");
  EXPECT_NO_THROW(ClipTokenizer::from_folder(dir.path));
}

TEST(Tokenizer, VocabJsonNotAnObject) {
  TempDir dir;
  dir.write("vocab.json", R"(["a", "b"])");
  dir.write("merges.txt", "#version: 0.2\n");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path + "/vocab.json: expected a JSON object of token -> id, found array");
  dir.write("vocab.json", R"({"a": "zero"})");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path +
                "/vocab.json: vocabulary: token 'a': expected a non-negative integer id, "
                "found \"zero\"");
  dir.write("vocab.json", R"({"a": 0})");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(dir.path); }),
            dir.path + "/vocab.json: unk_token '<|endoftext|>' is not in the vocabulary");
}

TEST(Tokenizer, TokenizerJsonOfAnotherModel) {
  TempDir bert_dir, clip_dir;
  bert_dir.copy(kDir + "/clip_tiny", "tokenizer.json");
  EXPECT_EQ(config_error([&] { BertTokenizer::from_folder(bert_dir.path); }),
            bert_dir.path +
                "/tokenizer.json: field 'model.type': expected \"WordPiece\", found "
                "\"BPE\"");
  clip_dir.copy(kDir + "/bert_tiny", "tokenizer.json");
  EXPECT_EQ(config_error([&] { ClipTokenizer::from_folder(clip_dir.path); }),
            clip_dir.path +
                "/tokenizer.json: field 'model.type': expected \"BPE\", found "
                "\"WordPiece\"");
}

TEST(Tokenizer, InvalidUtf8NamesTheByteOffset) {
  // transformers' tokenizers take Python str (Rust &str), which cannot hold invalid UTF-8: the
  // C++ API refuses it, naming the first bad byte, rather than guess replacement characters.
  const BertTokenizer bert = BertTokenizer::from_folder(kDir + "/bert_tiny");
  const ClipTokenizer clip = ClipTokenizer::from_folder(kDir + "/clip_tiny");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"abc\xff", "text: invalid UTF-8 at byte 3"},
      {"a cat\xe2\x82", "text: invalid UTF-8 at byte 5"},          // truncated sequence
      {"\xed\xa0\x80", "text: invalid UTF-8 at byte 0"},           // a surrogate
      {"x\xc0\xaf", "text: invalid UTF-8 at byte 1"},              // overlong '/'
      {"[CLS]\xf4\x90\x80\x80", "text: invalid UTF-8 at byte 5"},  // above U+10FFFF
      {"\x80 continuation", "text: invalid UTF-8 at byte 0"}};
  for (const auto& [text, message] : cases) {
    for (const auto& encode : {std::function<void()>([&] { bert.encode(text); }),
                               std::function<void()>([&] { clip.encode(text); })}) {
      try {
        encode();
        ADD_FAILURE() << "no error for " << message;
      } catch (const std::invalid_argument& e) {
        EXPECT_EQ(std::string(e.what()), message);
      }
    }
  }
}

}  // namespace
