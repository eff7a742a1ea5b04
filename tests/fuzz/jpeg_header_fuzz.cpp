// libFuzzer target: the host-side JPEG marker walk that decides the nvjpeg image decoder's
// declines (kernels/image/jpeg_header.cpp), checked against libjpeg-turbo's header reader.
// Invariants beyond "no crash, no sanitizer report": the walk stays inside the input; an input it
// accepts (baseline_decline_reason == nullptr) has a positive size, 1 or 3 components, one
// interleaved scan and ends on EOI; when libjpeg-turbo reads the same header it reads the same
// width, height and colour/gray decision; the walk of the input cut just after its EOI says the
// same (trailing bytes are ignored, as libjpeg ignores them). Seed corpus:
// tests/fuzz/corpus/jpeg_header/ (the committed JPEG set, the fixture photographs).
#include <turbojpeg.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/image/jpeg_header.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::kernels::image;
  using libreyolo::fuzz::fail;
  const JpegHeader h = parse_jpeg_header(data, size);
  if (h.end > size) fail("walk ended past the input");
  if (h.problem == nullptr && h.is_jpeg && !h.eoi) fail("no problem but no EOI");
  if (h.is_jpeg && h.problem != nullptr && h.eoi) fail("EOI with a problem");
  BaselineSupport support;  // no size limit: the size check is tested on its own
  const char* why = baseline_decline_reason(h, support);
  if (why == nullptr) {
    if (h.width <= 0 || h.height <= 0) fail("accepted an empty frame");
    if (h.components != 1 && h.components != 3) fail("accepted " + std::to_string(h.components));
    if (h.scans != 1 || !h.interleaved) fail("accepted several scans");
    if (h.end < 4 || data[h.end - 2] != 0xFF || data[h.end - 1] != 0xD9)
      fail("accepted input does not end on EOI at `end`");
    // The same walk over the input cut after EOI.
    const JpegHeader cut = parse_jpeg_header(data, h.end);
    if (baseline_decline_reason(cut, support) != nullptr || cut.width != h.width ||
        cut.height != h.height || cut.end != h.end)
      fail("the walk of the input cut after EOI differs");
    tjhandle tj = tjInitDecompress();
    if (tj == nullptr) fail("tjInitDecompress");
    int w = 0, ht = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), &w, &ht, &subsamp,
                            &colorspace) == 0) {
      if (w != h.width || ht != h.height)
        fail("libjpeg-turbo reads " + std::to_string(w) + "x" + std::to_string(ht) + ", the walk " +
             std::to_string(h.width) + "x" + std::to_string(h.height));
      if ((colorspace == TJCS_GRAY) != (h.components == 1)) fail("gray decision differs");
      if (colorspace == TJCS_RGB || colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
        fail("accepted a non-YCbCr colour space " + std::to_string(colorspace));
    }
    tjDestroy(tj);
  }
  return 0;
}
