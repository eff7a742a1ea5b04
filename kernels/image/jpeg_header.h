// A host-side walk of a JPEG datastream's markers (ITU-T T.81 Annex B), without decoding a
// pixel: the frame header (SOFn: coding process, precision, size, components and their sampling
// factors), JFIF / Adobe APP segments (colour transform), every scan header, and the entropy-coded
// data skipped up to the EOI marker (stuffed 0xFF00 bytes and RSTn markers stepped over). What the
// `nvjpeg` implementation of the `image_decode` slot (kernels/image/image_decode.h) decides its
// declines from, before any device work; also what tests and the jpeg_header fuzz target check.
//
// No torch, no CUDA, no libjpeg: plain C++ over a byte span; never reads outside [data, data +
// size), never throws, never allocates per byte.
#pragma once

#include <cstddef>
#include <cstdint>

namespace libreyolo::kernels::image {

/// The coding process of the frame header (the SOFn marker).
enum class JpegCoding {
  none,          ///< no frame header was read
  baseline,      ///< SOF0: baseline sequential DCT, Huffman
  extended,      ///< SOF1: extended sequential DCT, Huffman (8 or 12 bits)
  progressive,   ///< SOF2: progressive DCT, Huffman
  lossless,      ///< SOF3: lossless (sequential), Huffman
  arithmetic,    ///< SOF9, SOF10, SOF11: arithmetic coding
  hierarchical,  ///< SOF5-7, SOF13-15: differential (hierarchical) processes
};

/// The chroma subsampling of a 1- or 3-component frame (Y, Cb, Cr sampling factors).
enum class ChromaSubsampling {
  unknown,  ///< no frame, or a component count other than 1 and 3
  gray,     ///< one component
  s444,     ///< chroma at full resolution (Y 1x1)
  s422,     ///< Y 2x1 (horizontal halving)
  s420,     ///< Y 2x2
  s440,     ///< Y 1x2 (vertical halving)
  s411,     ///< Y 4x1
  s410,     ///< Y 4x2
  other,    ///< any other combination (chroma factors above 1, Y factors not listed above)
};

/// "4:2:0" ... "gray", "other", "unknown".
const char* subsampling_name(ChromaSubsampling s);

/// What parse_jpeg_header read. Sizes are the frame header's (the stored frame, no EXIF
/// orientation).
struct JpegHeader {
  bool is_jpeg = false;  ///< starts with SOI (FF D8) followed by a marker
  JpegCoding coding = JpegCoding::none;
  int precision = 0;         ///< sample bits (8, 12, 16)
  int width = 0;             ///< X of the frame header
  int height = 0;            ///< Y of the frame header (0: defined by a DNL marker)
  int components = 0;        ///< Nf
  int h[4] = {0, 0, 0, 0};   ///< horizontal sampling factor per component (first 4)
  int v[4] = {0, 0, 0, 0};   ///< vertical sampling factor per component (first 4)
  int id[4] = {0, 0, 0, 0};  ///< component identifiers (first 4)
  ChromaSubsampling subsampling = ChromaSubsampling::unknown;
  bool jfif = false;         ///< an APP0 "JFIF\0" segment
  bool adobe = false;        ///< an APP14 "Adobe" segment
  int adobe_transform = -1;  ///< its transform flag (0 none/RGB/CMYK, 1 YCbCr, 2 YCCK); -1: none
  int scans = 0;             ///< SOS markers read
  bool interleaved = false;  ///< the first scan codes every component of the frame
  bool eoi = false;          ///< the EOI marker was reached after a scan
  /// nullptr when the walk reached EOI; else what stopped it (a string literal, one of the
  /// kProblem* below).
  const char* problem = nullptr;
  std::size_t end = 0;  ///< offset just past EOI (or where the walk stopped)
};

/// Why a walk stopped before EOI.
inline constexpr char kProblemNotJpeg[] = "not a JPEG (no SOI marker)";
inline constexpr char kProblemTruncated[] = "truncated before the EOI marker";
inline constexpr char kProblemCorrupt[] = "corrupt marker structure";
inline constexpr char kProblemFrame[] = "corrupt frame header";
inline constexpr char kProblemScan[] = "corrupt scan header";
inline constexpr char kProblemUnknownMarker[] = "unknown or reserved marker";

/// Walks `data`. Never throws, never reads outside the span; a null pointer or size 0 is "not a
/// JPEG".
JpegHeader parse_jpeg_header(const uint8_t* data, std::size_t size);

/// True when the colour components are coded without the YCbCr transform (libjpeg's
/// jdapimin.c default_decompress_parms rule for 3 components: an Adobe marker with transform 0,
/// or, without JFIF and Adobe markers, the component identifiers 'R', 'G', 'B').
bool rgb_components(const JpegHeader& header);

/// What a decoder of baseline JPEGs can take.
struct BaselineSupport {
  bool s411_s410 = false;  ///< 4:1:1 and 4:1:0 (nvJPEG's hardware backend: no)
  int64_t max_pixels = 0;  ///< width * height above this declines (0: no limit)
};

// The `nvjpeg` implementation's decline reasons (the Decline's string literal, the key of
// libreyolo_kernel_declined_total{reason}). Every one sends the image to the reference, which
// decodes it or reports the exact INVALID_ARGUMENT text of the CPU path.
inline constexpr char kDeclineNotJpeg[] = "nvjpeg: not a JPEG (PNG or another format)";
inline constexpr char kDeclineTruncated[] = "nvjpeg: truncated JPEG (no EOI marker)";
inline constexpr char kDeclineCorrupt[] = "nvjpeg: corrupt JPEG (marker check)";
inline constexpr char kDeclineProgressive[] = "nvjpeg: progressive JPEG";
inline constexpr char kDeclineLossless[] = "nvjpeg: lossless JPEG";
inline constexpr char kDeclineArithmetic[] = "nvjpeg: arithmetic-coded JPEG";
inline constexpr char kDeclineHierarchical[] = "nvjpeg: hierarchical JPEG";
inline constexpr char kDeclinePrecision[] = "nvjpeg: 12- or 16-bit samples";
inline constexpr char kDeclineCmyk[] = "nvjpeg: CMYK or YCCK (4 components)";
inline constexpr char kDeclineComponents[] = "nvjpeg: component count other than 1, 3, 4";
inline constexpr char kDeclineRgb[] = "nvjpeg: RGB components (no YCbCr transform)";
inline constexpr char kDeclineSubsampling[] = "nvjpeg: unsupported chroma subsampling";
inline constexpr char kDeclineMultiScan[] = "nvjpeg: several scans (non-interleaved)";
inline constexpr char kDeclineSize[] = "nvjpeg: size empty or above max_pixels";

/// nullptr when `header` is a complete (EOI reached) baseline or extended 8-bit Huffman JPEG of
/// 1 or 3 YCbCr components in one interleaved scan, with a subsampling `support` takes and a
/// size within its limit; else the kDecline* reason, checked in this order: not JPEG, corrupt
/// or truncated structure, coding process, precision, component count, CMYK/YCCK, RGB
/// components, subsampling, size, several scans.
const char* baseline_decline_reason(const JpegHeader& header, const BaselineSupport& support);

}  // namespace libreyolo::kernels::image
