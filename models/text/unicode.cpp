#include "models/text/unicode.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <stdexcept>

namespace libreyolo::models::text {
namespace {

struct CodePointRange {
  char32_t first, last;
};
struct CaseRun {
  char32_t first, last;
  std::int32_t delta;
  std::uint8_t stride;
};
struct CombiningRun {
  char32_t first, last;
  std::uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  std::uint16_t offset;
  std::uint8_t length;
};
struct Composition {
  char32_t first, second, composite;
};

#include "models/text/unicode_tables.inc"

template <std::size_t N>
bool in_ranges(const CodePointRange (&table)[N], char32_t cp) {
  const auto* it =
      std::upper_bound(std::begin(table), std::end(table), cp,
                       [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return it != std::begin(table) && cp <= std::prev(it)->last;
}

// Hangul syllables decompose and compose algorithmically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

std::uint8_t combining_class(char32_t cp) {
  const auto* it = std::upper_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                                    [](char32_t c, const CombiningRun& r) { return c < r.first; });
  if (it == std::begin(kCombiningClass) || cp > std::prev(it)->last) return 0;
  return std::prev(it)->ccc;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
    return;
  }
  const auto* it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                                    [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it != std::end(kDecomposition) && it->cp == cp) {
    out.append(kDecompositionData + it->offset, it->length);
  } else {
    out += cp;
  }
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* it =
      std::lower_bound(std::begin(kComposition), std::end(kComposition), Composition{a, b, 0},
                       [](const Composition& x, const Composition& y) {
                         return x.first != y.first ? x.first < y.first : x.second < y.second;
                       });
  if (it != std::end(kComposition) && it->first == a && it->second == b) return it->composite;
  return 0;
}

[[noreturn]] void invalid_utf8(std::size_t offset) {
  throw std::invalid_argument("text: invalid UTF-8 at byte " + std::to_string(offset));
}

}  // namespace

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    if (b0 < 0x80) {
      out += b0;
      ++i;
      continue;
    }
    std::size_t length;
    char32_t cp, min;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      length = 2, cp = b0 & 0x1F, min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      length = 3, cp = b0 & 0x0F, min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      length = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      invalid_utf8(i);
    }
    if (i + length > text.size()) invalid_utf8(i);
    for (std::size_t k = 1; k < length; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) invalid_utf8(i);
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) invalid_utf8(i);
    out += cp;
    i += length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_utf8(out, cp);
  return out;
}

bool is_bert_removed(char32_t cp) { return in_ranges(kBertRemoved, cp); }
bool is_bert_space(char32_t cp) { return cp == U' ' || in_ranges(kBertSpace, cp); }
bool is_cjk(char32_t cp) { return in_ranges(kCjk, cp); }
bool is_bert_whitespace(char32_t cp) { return in_ranges(kBertPreWhitespace, cp); }
bool is_bert_punctuation(char32_t cp) { return in_ranges(kBertPunctuation, cp); }
bool is_mark(char32_t cp) { return in_ranges(kMark, cp); }
bool is_regex_space(char32_t cp) { return in_ranges(kRegexSpace, cp); }
bool is_regex_letter(char32_t cp) { return in_ranges(kRegexLetter, cp); }
bool is_regex_number(char32_t cp) { return in_ranges(kRegexNumber, cp); }

std::u32string nfd(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) decompose(cp, out);
  // Canonical ordering: each run of non-starters sorted (stably) by combining class.
  for (std::size_t i = 0; i < out.size();) {
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < out.size() && combining_class(out[end]) != 0) ++end;
    std::stable_sort(out.begin() + i, out.begin() + end, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = end;
  }
  return out;
}

std::u32string nfc(std::u32string_view text) {
  // Canonical composition (Unicode 3.11 D117): a character composes with the last starter
  // unless a character of the same or a higher class, or a starter, stands between them.
  std::u32string d = nfd(text);
  std::u32string out;
  out.reserve(d.size());
  std::size_t starter = std::u32string::npos;
  int last_class = -1;
  for (char32_t cp : d) {
    const int cls = combining_class(cp);
    if (starter != std::u32string::npos &&
        (last_class < cls || (last_class == 0 && cls == 0 && out.size() == starter + 1))) {
      if (const char32_t composite = compose_pair(out[starter], cp)) {
        out[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = out.size();
      last_class = 0;
    } else {
      last_class = cls;
    }
    out += cp;
  }
  return out;
}

std::u32string lowercase(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) {
    if (cp == 0x130) {  // the one code point whose lower case is two (Rust's to_lowercase)
      out += U'i';
      out += char32_t{0x307};
      continue;
    }
    const auto* it = std::upper_bound(std::begin(kLowercase), std::end(kLowercase), cp,
                                      [](char32_t c, const CaseRun& r) { return c < r.first; });
    if (it != std::begin(kLowercase)) {
      const CaseRun& run = *std::prev(it);
      if (cp <= run.last && (cp - run.first) % run.stride == 0) {
        out += static_cast<char32_t>(static_cast<std::int32_t>(cp) + run.delta);
        continue;
      }
    }
    out += cp;
  }
  return out;
}

}  // namespace libreyolo::models::text
