// The marker walk of kernels/image/jpeg_header.h. Marker codes: ITU-T T.81 Table B.1.
#include "kernels/image/jpeg_header.h"

#include <cstring>

namespace libreyolo::kernels::image {
namespace {

constexpr uint8_t kSoi = 0xD8, kEoi = 0xD9, kSos = 0xDA, kTem = 0x01;

bool is_rst(uint8_t m) { return m >= 0xD0 && m <= 0xD7; }

bool is_sof(uint8_t m) {
  // C0-CF less DHT (C4), JPG (C8) and DAC (CC).
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

JpegCoding coding_of(uint8_t m) {
  switch (m) {
    case 0xC0:
      return JpegCoding::baseline;
    case 0xC1:
      return JpegCoding::extended;
    case 0xC2:
      return JpegCoding::progressive;
    case 0xC3:
      return JpegCoding::lossless;
    case 0xC9:
    case 0xCA:
    case 0xCB:
      return JpegCoding::arithmetic;
    default:
      return JpegCoding::hierarchical;  // C5-C7, CD-CF
  }
}

/// Segments with a length that libjpeg reads or skips (jdmarker.c read_markers): DHT, DAC,
/// DQT, DRI, DNL, APPn, COM. Anything else with a length (JPGn, DHP, EXP, RESn, JPG) is
/// libjpeg's JERR_UNKNOWN_MARKER.
bool is_known_segment(uint8_t m) {
  return m == 0xC4 || m == 0xCC || m == 0xDB || m == 0xDD || m == 0xDC ||
         (m >= 0xE0 && m <= 0xEF) || m == 0xFE;
}

ChromaSubsampling subsampling_of(const JpegHeader& h) {
  if (h.components == 1) return ChromaSubsampling::gray;
  if (h.components != 3) return ChromaSubsampling::unknown;
  if (h.h[1] != 1 || h.v[1] != 1 || h.h[2] != 1 || h.v[2] != 1) return ChromaSubsampling::other;
  const int hy = h.h[0], vy = h.v[0];
  if (hy == 1 && vy == 1) return ChromaSubsampling::s444;
  if (hy == 2 && vy == 1) return ChromaSubsampling::s422;
  if (hy == 2 && vy == 2) return ChromaSubsampling::s420;
  if (hy == 1 && vy == 2) return ChromaSubsampling::s440;
  if (hy == 4 && vy == 1) return ChromaSubsampling::s411;
  if (hy == 4 && vy == 2) return ChromaSubsampling::s410;
  return ChromaSubsampling::other;
}

/// Reads the frame header segment s[0..n) (after the length). False: malformed.
bool read_frame(const uint8_t* s, std::size_t n, uint8_t marker, JpegHeader& h) {
  if (n < 6) return false;
  const int nf = s[5];
  if (nf < 1 || n != 6 + 3 * static_cast<std::size_t>(nf)) return false;
  h.coding = coding_of(marker);
  h.precision = s[0];
  h.height = s[1] << 8 | s[2];
  h.width = s[3] << 8 | s[4];
  h.components = nf;
  for (int c = 0; c < nf; ++c) {
    const uint8_t* p = s + 6 + 3 * c;
    const int hc = p[1] >> 4, vc = p[1] & 0x0F;
    if (hc < 1 || hc > 4 || vc < 1 || vc > 4) return false;  // T.81 B.2.2: 1..4
    if (c < 4) {
      h.id[c] = p[0];
      h.h[c] = hc;
      h.v[c] = vc;
    }
  }
  h.subsampling = subsampling_of(h);
  return true;
}

/// Reads a scan header segment s[0..n). False: malformed.
bool read_scan(const uint8_t* s, std::size_t n, JpegHeader& h) {
  if (n < 1) return false;
  const int ns = s[0];
  if (ns < 1 || ns > 4 || n != 4 + 2 * static_cast<std::size_t>(ns)) return false;
  if (h.scans == 0) h.interleaved = ns == h.components;
  ++h.scans;
  return true;
}

}  // namespace

const char* subsampling_name(ChromaSubsampling s) {
  switch (s) {
    case ChromaSubsampling::gray:
      return "gray";
    case ChromaSubsampling::s444:
      return "4:4:4";
    case ChromaSubsampling::s422:
      return "4:2:2";
    case ChromaSubsampling::s420:
      return "4:2:0";
    case ChromaSubsampling::s440:
      return "4:4:0";
    case ChromaSubsampling::s411:
      return "4:1:1";
    case ChromaSubsampling::s410:
      return "4:1:0";
    case ChromaSubsampling::other:
      return "other";
    default:
      return "unknown";
  }
}

JpegHeader parse_jpeg_header(const uint8_t* d, std::size_t n) {
  JpegHeader h;
  if (d == nullptr || n < 3 || d[0] != 0xFF || d[1] != kSoi || d[2] != 0xFF) {
    h.problem = kProblemNotJpeg;
    return h;
  }
  h.is_jpeg = true;
  std::size_t at = 2;
  auto stop = [&](const char* problem) {
    h.problem = problem;
    h.end = at;
    return h;
  };
  for (;;) {
    // A marker: 0xFF, optional 0xFF fill bytes, the code. Anything else between segments is
    // libjpeg's "extraneous bytes before marker" warning, an error for the strict CPU path.
    if (at >= n) return stop(kProblemTruncated);
    if (d[at] != 0xFF) return stop(kProblemCorrupt);
    while (at < n && d[at] == 0xFF) ++at;
    if (at >= n) return stop(kProblemTruncated);
    const uint8_t m = d[at++];
    if (m == kEoi) {
      if (h.scans == 0) return stop(kProblemCorrupt);  // no image
      h.eoi = true;
      h.end = at;
      return h;
    }
    if (m == kSoi || m == 0x00) return stop(kProblemCorrupt);
    if (m == kTem || is_rst(m)) continue;  // parameterless; libjpeg ignores them here
    if (n - at < 2) return stop(kProblemTruncated);
    const std::size_t length = static_cast<std::size_t>(d[at]) << 8 | d[at + 1];
    if (length < 2) return stop(kProblemCorrupt);
    if (length > n - at) return stop(kProblemTruncated);
    const uint8_t* s = d + at + 2;
    const std::size_t len = length - 2;
    if (is_sof(m)) {
      if (h.coding != JpegCoding::none) return stop(kProblemFrame);  // a second frame header
      if (!read_frame(s, len, m, h)) return stop(kProblemFrame);
    } else if (m == kSos) {
      if (h.coding == JpegCoding::none) return stop(kProblemScan);  // scan before the frame
      if (!read_scan(s, len, h)) return stop(kProblemScan);
      at += length;
      // Entropy-coded data: up to the next marker that is not 0xFF00 (stuffing) or RSTn.
      for (;;) {
        const void* ff = at < n ? std::memchr(d + at, 0xFF, n - at) : nullptr;
        if (ff == nullptr) {
          at = n;
          return stop(kProblemTruncated);
        }
        at = static_cast<std::size_t>(static_cast<const uint8_t*>(ff) - d);
        std::size_t next = at + 1;
        while (next < n && d[next] == 0xFF) ++next;  // fill bytes
        if (next >= n) {
          at = n;
          return stop(kProblemTruncated);
        }
        if (d[next] == 0x00 || is_rst(d[next])) {
          at = next + 1;
          continue;
        }
        break;  // a marker: `at` is on its first 0xFF
      }
      continue;
    } else if (m == 0xE0 && len >= 5 && std::memcmp(s, "JFIF\0", 5) == 0) {
      h.jfif = true;
    } else if (m == 0xEE && len >= 12 && std::memcmp(s, "Adobe", 5) == 0) {
      h.adobe = true;
      h.adobe_transform = s[11];
    } else if (!is_known_segment(m)) {
      return stop(kProblemUnknownMarker);
    }
    at += length;
  }
}

bool rgb_components(const JpegHeader& h) {
  if (h.components != 3) return false;
  if (h.adobe) return h.adobe_transform == 0;
  if (h.jfif) return false;
  return h.id[0] == 'R' && h.id[1] == 'G' && h.id[2] == 'B';
}

const char* baseline_decline_reason(const JpegHeader& h, const BaselineSupport& support) {
  if (!h.is_jpeg) return kDeclineNotJpeg;
  if (h.problem == kProblemTruncated) return kDeclineTruncated;
  if (h.problem != nullptr || !h.eoi) return kDeclineCorrupt;
  switch (h.coding) {
    case JpegCoding::baseline:
    case JpegCoding::extended:
      break;
    case JpegCoding::progressive:
      return kDeclineProgressive;
    case JpegCoding::lossless:
      return kDeclineLossless;
    case JpegCoding::arithmetic:
      return kDeclineArithmetic;
    case JpegCoding::hierarchical:
      return kDeclineHierarchical;
    default:
      return kDeclineCorrupt;
  }
  if (h.precision != 8) return kDeclinePrecision;
  if (h.components == 4) return kDeclineCmyk;
  if (h.components != 1 && h.components != 3) return kDeclineComponents;
  if (rgb_components(h)) return kDeclineRgb;
  switch (h.subsampling) {
    case ChromaSubsampling::gray:
    case ChromaSubsampling::s444:
    case ChromaSubsampling::s422:
    case ChromaSubsampling::s420:
    case ChromaSubsampling::s440:
      break;
    case ChromaSubsampling::s411:
    case ChromaSubsampling::s410:
      if (support.s411_s410) break;
      return kDeclineSubsampling;
    default:
      return kDeclineSubsampling;
  }
  if (h.width <= 0 || h.height <= 0) return kDeclineSize;
  if (support.max_pixels > 0 && h.width > support.max_pixels / h.height) return kDeclineSize;
  if (h.scans != 1 || !h.interleaved) return kDeclineMultiScan;
  return nullptr;
}

}  // namespace libreyolo::kernels::image
