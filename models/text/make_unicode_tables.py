#!/usr/bin/env python3
"""Generates models/text/unicode_tables.inc: the Unicode data the tokenizers of models/text/ need.

The reference is what transformers 5.17 runs, the Rust `tokenizers` library, not Python's
unicodedata: its crates carry older Unicode versions (unicode_categories for punctuation and
control, unicode-normalization-alignments for NFD/NFC and combining marks) and Rust's std for
lower-casing and whitespace, and Oniguruma for the CLIP regex classes. So every per-code-point
property is probed from `tokenizers` itself, one code point at a time; unicodedata only supplies
the canonical combining classes and the composition pairs that NFC needs, checked against the
library's NFC. The differences from unicodedata are printed (for the record, not used).

Tables are ranges (or runs with a constant delta) wherever the data allows.
Run: python models/text/make_unicode_tables.py  (writes models/text/unicode_tables.inc)
"""
import os
import unicodedata

import tokenizers
from tokenizers import Regex, normalizers, pre_tokenizers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unicode_tables.inc")
CODE_POINTS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


def probe(function):
    return [cp for cp in CODE_POINTS if function(chr(cp))]


def ranges(cps):
    out = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def main():
    bert = lambda **kw: normalizers.BertNormalizer(**{**dict(clean_text=False, handle_chinese_chars=False,
                                                            strip_accents=False, lowercase=False), **kw})
    clean, chinese = bert(clean_text=True), bert(handle_chinese_chars=True)
    strip, lower = bert(strip_accents=True), bert(lowercase=True)
    nfd, nfc, lowercase = normalizers.NFD(), normalizers.NFC(), normalizers.Lowercase()
    pre = pre_tokenizers.BertPreTokenizer()
    space_re = normalizers.Replace(Regex(r"\s"), "")
    letter_re = normalizers.Replace(Regex(r"\p{L}"), "")
    number_re = normalizers.Replace(Regex(r"\p{N}"), "")

    tables = {}
    # BertNormalizer clean_text: removed (NUL, U+FFFD, the library's "other" categories but tab,
    # newline, carriage return) and turned into a space (its is_whitespace).
    tables["kBertRemoved"] = ranges(probe(lambda c: clean.normalize_str(c) == ""))
    tables["kBertSpace"] = ranges(probe(lambda c: c != " " and clean.normalize_str(c) == " "))
    # handle_chinese_chars: " c " (the CJK ideograph blocks of BERT's _is_chinese_char).
    tables["kCjk"] = ranges(probe(lambda c: chinese.normalize_str(c) == f" {c} "))
    # BertPreTokenizer: split on Rust's char::is_whitespace, isolate punctuation.
    tables["kBertPreWhitespace"] = ranges(probe(lambda c: [w for w, _ in pre.pre_tokenize_str("a" + c + "a")] == ["a", "a"]))
    tables["kBertPunctuation"] = ranges(probe(lambda c: [w for w, _ in pre.pre_tokenize_str("a" + c + "a")] == ["a", c, "a"]))
    # Oniguruma's \s, \p{L}, \p{N} (CLIP's normalizer and pre-tokenizer regexes).
    tables["kRegexSpace"] = ranges(probe(lambda c: space_re.normalize_str(c) == ""))
    tables["kRegexLetter"] = ranges(probe(lambda c: letter_re.normalize_str(c) == ""))
    tables["kRegexNumber"] = ranges(probe(lambda c: number_re.normalize_str(c) == ""))

    # Canonical decompositions (full, as the library's NFD gives them; Hangul syllables are
    # algorithmic in the C++), the marks strip_accents drops after NFD.
    decompositions = {}
    for cp in CODE_POINTS:
        if HANGUL_FIRST <= cp <= HANGUL_LAST:
            continue
        d = nfd.normalize_str(chr(cp))
        if d != chr(cp):
            decompositions[cp] = [ord(x) for x in d]
    marks = set(probe(lambda c: strip.normalize_str(c) == "" and nfd.normalize_str(c) == c))
    for cp, d in decompositions.items():  # strip_accents = NFD, then drop marks
        expected = "".join(chr(x) for x in d if x not in marks)
        assert strip.normalize_str(chr(cp)) == expected, hex(cp)
    tables["kMark"] = ranges(marks)

    # Lower-casing (Rust's char::to_lowercase, one code point to one, but U+0130 -> "i\u0307").
    lower_map = {}
    for cp in CODE_POINTS:
        c = chr(cp)
        low = lower.normalize_str(c)
        assert low == lowercase.normalize_str(c)
        if low != c:
            if len(low) != 1:
                assert cp == 0x130 and low == "i\u0307", (hex(cp), low)
                continue
            lower_map[cp] = ord(low)
    runs = []  # [first, last, delta, stride]
    for cp in sorted(lower_map):
        delta = lower_map[cp] - cp
        if runs and runs[-1][2] == delta and cp - runs[-1][1] in (1, 2) and (
                runs[-1][0] == runs[-1][1] or cp - runs[-1][1] == runs[-1][3]):
            runs[-1][3] = cp - runs[-1][1]
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, delta, 1])

    # Canonical combining classes (unicodedata) and NFC's primary composites: the two-code-point
    # canonical decompositions (unicodedata.decomposition) that the library's NFC recomposes.
    combining = {cp: unicodedata.combining(chr(cp)) for cp in CODE_POINTS if unicodedata.combining(chr(cp))}
    ccc_runs = []
    for cp in sorted(combining):
        if ccc_runs and ccc_runs[-1][1] == cp - 1 and ccc_runs[-1][2] == combining[cp]:
            ccc_runs[-1][1] = cp
        else:
            ccc_runs.append([cp, cp, combining[cp]])
    compositions = []
    for cp in CODE_POINTS:
        fields = unicodedata.decomposition(chr(cp)).split()
        if len(fields) == 2 and not fields[0].startswith("<"):
            a, b = (int(x, 16) for x in fields)
            if nfc.normalize_str(chr(a) + chr(b)) == chr(cp):
                compositions.append((a, b, cp))
    compositions.sort()

    # The record: where the library differs from Python's unicodedata.
    ud = unicodedata.unidata_version
    py_p = set(cp for cp in CODE_POINTS if unicodedata.category(chr(cp)).startswith("P") or
               33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126)
    lib_p = set(cp for a, b in tables["kBertPunctuation"] for cp in range(a, b + 1))
    print(f"punctuation: {len(py_p ^ lib_p)} code points differ from unicodedata {ud}")
    py_c = set(cp for cp in CODE_POINTS if unicodedata.category(chr(cp)).startswith("C") and chr(cp) not in "\t\n\r")
    lib_c = set(cp for a, b in tables["kBertRemoved"] for cp in range(a, b + 1))
    print(f"control (clean_text): {len(py_c ^ lib_c)} differ (the library keeps unassigned code points)")

    def emit_ranges(f, name, rs, comment):
        f.write(f"// {comment}\nconstexpr CodePointRange {name}[] = {{\n")
        items = [f"{{0x{a:X}, 0x{b:X}}}" for a, b in rs]
        for i in range(0, len(items), 6):
            f.write("    " + ", ".join(items[i:i + 6]) + ",\n")
        f.write("};\n\n")

    comments = {
        "kBertRemoved": "BertNormalizer clean_text: dropped (NUL, U+FFFD, control/format/private/...).",
        "kBertSpace": "BertNormalizer clean_text: replaced by a space.",
        "kCjk": "BertNormalizer handle_chinese_chars: the CJK ideographs surrounded by spaces.",
        "kBertPreWhitespace": "BertPreTokenizer: whitespace (split, removed).",
        "kBertPunctuation": "BertPreTokenizer: punctuation (isolated).",
        "kRegexSpace": "Oniguruma \\s (CLIP's normalizer and pre-tokenizer).",
        "kRegexLetter": "Oniguruma \\p{L}.",
        "kRegexNumber": "Oniguruma \\p{N}.",
        "kMark": "strip_accents: the combining marks dropped after NFD.",
    }
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(f"// Generated by models/text/make_unicode_tables.py from tokenizers {tokenizers.__version__}\n"
                f"// (per-code-point probes) and Python {ud} unicodedata (combining classes). Do not edit.\n"
                "// clang-format off\n\n")
        for name in comments:
            emit_ranges(f, name, tables[name], comments[name])
        f.write("// Rust's char::to_lowercase: first..last (every `stride`-th) map to cp + delta.\n"
                "constexpr CaseRun kLowercase[] = {\n")
        items = [f"{{0x{a:X}, 0x{b:X}, {d}, {s}}}" for a, b, d, s in runs]
        for i in range(0, len(items), 4):
            f.write("    " + ", ".join(items[i:i + 4]) + ",\n")
        f.write("};\n\n// Canonical combining classes (non-zero).\nconstexpr CombiningRun kCombiningClass[] = {\n")
        items = [f"{{0x{a:X}, 0x{b:X}, {c}}}" for a, b, c in ccc_runs]
        for i in range(0, len(items), 5):
            f.write("    " + ", ".join(items[i:i + 5]) + ",\n")
        f.write("};\n\n// Full canonical decompositions (NFD), Hangul syllables excepted: code point,\n"
                "// offset and length in kDecompositionData.\nconstexpr Decomposition kDecomposition[] = {\n")
        data, items = [], []
        for cp in sorted(decompositions):
            items.append(f"{{0x{cp:X}, {len(data)}, {len(decompositions[cp])}}}")
            data += decompositions[cp]
        for i in range(0, len(items), 5):
            f.write("    " + ", ".join(items[i:i + 5]) + ",\n")
        f.write("};\nconstexpr char32_t kDecompositionData[] = {\n")
        items = [f"0x{x:X}" for x in data]
        for i in range(0, len(items), 10):
            f.write("    " + ", ".join(items[i:i + 10]) + ",\n")
        f.write("};\n\n// NFC primary composites: (first, second) -> composite, sorted.\n"
                "constexpr Composition kComposition[] = {\n")
        items = [f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}" for a, b, c in compositions]
        for i in range(0, len(items), 4):
            f.write("    " + ", ".join(items[i:i + 4]) + ",\n")
        f.write("};\n// clang-format on\n")
    print(f"wrote {OUT}: {os.path.getsize(OUT)} bytes; {len(decompositions)} decompositions, "
          f"{len(compositions)} compositions, {len(runs)} lowercase runs")


if __name__ == "__main__":
    main()
