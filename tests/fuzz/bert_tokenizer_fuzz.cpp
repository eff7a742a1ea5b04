// libFuzzer target: the text of a prompt through BertTokenizer (WordPiece:
// models/text/bert_tokenizer.cpp, BertNormalizer, BertPreTokenizer) and the shared Unicode code
// (models/text/unicode.cpp) and truncation/padding (models/text/tokenizer.cpp), with the tokenizer
// of tests/fixtures/tokenizers/bert_tiny (model_max_length 64). Either the text is refused as
// invalid UTF-8 (std::invalid_argument naming a byte offset inside it) or every encoding is framed
// by the begin/end tokens, holds ids of the vocabulary only and is no longer than the max length;
// padded to max_length it is exactly that long with a mask of ones then zeros. Seed corpus:
// tests/fuzz/corpus/bert_tokenizer/ (fixture strings, make_seeds.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/text/bert_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using libreyolo::fuzz::fail;
using libreyolo::models::text::BertTokenizer;
using libreyolo::models::text::Encoding;
using libreyolo::models::text::Padding;

const BertTokenizer& tokenizer() {
  static const BertTokenizer t = [] {
    const char* env = std::getenv("LIBREYOLO_FUZZ_FIXTURES");
    const std::string fixtures = env && *env ? env : LIBREYOLO_TEST_FIXTURES;
    return BertTokenizer::from_folder(fixtures + "/tokenizers/bert_tiny");
  }();
  return t;
}

void check(const Encoding& e, std::size_t max_length, const std::string& what) {
  const BertTokenizer& t = tokenizer();
  if (e.ids.size() != e.attention_mask.size()) fail(what + ": ids and mask differ in length");
  if (e.ids.size() < 2 || e.ids.size() > max_length) fail(what + ": length out of range");
  for (std::int64_t id : e.ids)
    if (id < 0 || id >= t.vocab_size()) fail(what + ": id " + std::to_string(id) + " out of range");
  std::size_t ones = 0;
  while (ones < e.attention_mask.size() && e.attention_mask[ones] == 1) ++ones;
  for (std::size_t i = ones; i < e.attention_mask.size(); ++i)
    if (e.attention_mask[i] != 0 || e.ids[i] != t.pad_id()) fail(what + ": bad padding");
  if (ones < 2 || e.ids[0] != t.begin_id() || e.ids[ones - 1] != t.end_id())
    fail(what + ": not framed by the begin and end tokens");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const BertTokenizer& t = tokenizer();
  const auto max_length = static_cast<std::size_t>(t.model_max_length());
  Encoding e;
  try {
    e = t.encode(text);
  } catch (const std::invalid_argument& error) {
    const std::string m = error.what();
    const std::string prefix = "text: invalid UTF-8 at byte ";
    if (m.compare(0, prefix.size(), prefix) != 0) fail("unexpected error: " + m);
    if (std::stoull(m.substr(prefix.size())) >= size) fail("offset beyond the text: " + m);
    return 0;
  }
  check(e, max_length, "encode");
  if (e.attention_mask.back() != 1) fail("encode: padding without padding");
  const std::vector<std::int64_t> content = t.content_ids(text);
  if (content.size() + 2 < e.ids.size() ||
      (content.size() + 2 > e.ids.size() && e.ids.size() != max_length))
    fail("truncated below max_length");
  const std::vector<Encoding> batch = t.encode_batch({text, "a"}, Padding::kMaxLength);
  for (const Encoding& b : batch) {
    check(b, max_length, "padded");
    if (b.ids.size() != max_length) fail("padded: not max_length long");
  }
  if (std::vector<std::int64_t>(batch[0].ids.begin(), batch[0].ids.begin() + e.ids.size()) != e.ids)
    fail("padded: ids differ from encode's");
  const Encoding short_one = t.encode(text, 3);
  check(short_one, 3, "max_length 3");
  return 0;
}
