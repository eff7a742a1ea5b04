// The `nvjpeg` implementation of `image_decode` (kernels/image/image_decode.h) and its provider.
//
// nvJPEG is opened with dlopen, never linked: the CPU-only CI machine has a CUDA toolkit without
// libnvjpeg (and this build machine has no nvjpeg.h), and a CPU-only run must start. The few
// declarations used are restated below from nvJPEG's public header (nvjpeg.h, CUDA 11.6 through
// 13: the enum values and the nvjpegImage_t layout are part of its ABI); a symbol that is missing
// makes the provider unavailable with the symbol's name, never a crash.
//
// Backend: the hardware JPEG decoder (NVJPEG_BACKEND_HARDWARE, batched API: A100, H100, H200)
// where nvjpegCreateEx accepts it and reports engines, else NVJPEG_BACKEND_DEFAULT through
// nvjpegDecode (hybrid: Huffman on the CPU, IDCT and colour conversion on the GPU). One library
// handle per device, created at the first decode on it; decoding states in a pool per device
// (one per concurrent caller, reused: their buffers grow to the largest image and stay).
// `image_decode_batch` decodes a call's images with one nvjpegDecodeBatched (hardware backend
// only: its engines decode the batch's images in parallel); a state is initialised for one batch
// size at a time, so the pool hands out a state of the asked size first.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/image/jpeg_header.h"
#include "kernels/registry.h"
#include "log/log.h"

namespace libreyolo::kernels {
namespace {

// --- nvjpeg.h, the part used (values and layouts from NVIDIA's header) ----------------------
using nvjpegStatus_t = int;
constexpr nvjpegStatus_t kSuccess = 0;
constexpr nvjpegStatus_t kBadJpeg = 3;
constexpr nvjpegStatus_t kJpegNotSupported = 4;
constexpr nvjpegStatus_t kAllocatorFailure = 5;
constexpr nvjpegStatus_t kImplementationNotSupported = 9;
constexpr nvjpegStatus_t kIncompleteBitstream = 10;
constexpr int kBackendDefault = 0;   // NVJPEG_BACKEND_DEFAULT
constexpr int kBackendHardware = 3;  // NVJPEG_BACKEND_HARDWARE
constexpr int kOutputRgb = 3;        // NVJPEG_OUTPUT_RGB: planar R, G, B
struct nvjpegImage_t {
  unsigned char* channel[4];
  size_t pitch[4];
};
using Handle_t = void*;  // nvjpegHandle_t
using State_t = void*;   // nvjpegJpegState_t
using Stream_t = void*;  // nvjpegJpegStream_t

struct NvjpegApi {
  nvjpegStatus_t (*CreateEx)(int, void*, void*, unsigned, Handle_t*) = nullptr;
  nvjpegStatus_t (*JpegStateCreate)(Handle_t, State_t*) = nullptr;
  nvjpegStatus_t (*JpegStateDestroy)(State_t) = nullptr;
  nvjpegStatus_t (*Decode)(Handle_t, State_t, const unsigned char*, size_t, int, nvjpegImage_t*,
                           cudaStream_t) = nullptr;
  nvjpegStatus_t (*DecodeBatchedInitialize)(Handle_t, State_t, int, int, int) = nullptr;
  nvjpegStatus_t (*DecodeBatched)(Handle_t, State_t, const unsigned char* const*, const size_t*,
                                  nvjpegImage_t*, cudaStream_t) = nullptr;
  nvjpegStatus_t (*JpegStreamCreate)(Handle_t, Stream_t*) = nullptr;
  nvjpegStatus_t (*JpegStreamParse)(Handle_t, const unsigned char*, size_t, int, int,
                                    Stream_t) = nullptr;
  nvjpegStatus_t (*DecodeBatchedSupported)(Handle_t, Stream_t, int*) = nullptr;
  // Optional (CUDA 11.4+): engines of the hardware decoder.
  nvjpegStatus_t (*GetHardwareDecoderInfo)(Handle_t, unsigned*, unsigned*) = nullptr;
  std::string path;   ///< the library opened
  std::string error;  ///< why it is not usable ("" when it is)
};

/// Where libnvjpeg may be: the loader's path first (LD_LIBRARY_PATH, ld.so.cache), then the
/// toolkit, then the wheels next to LibTorch (nvidia/cu13/lib, torchvision.libs).
std::vector<std::string> library_candidates() {
  std::vector<std::string> out{"libnvjpeg.so.13"};
  if (const char* home = std::getenv("CUDA_HOME"); home && *home)
    out.push_back(std::string(home) + "/lib64/libnvjpeg.so.13");
  out.push_back("/usr/local/cuda/lib64/libnvjpeg.so.13");
  out.push_back("/usr/local/cuda/targets/x86_64-linux/lib/libnvjpeg.so.13");
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::cuda::getCurrentCUDAStream), &info) && info.dli_fname) {
    // .../site-packages/torch/lib/libtorch_cuda.so -> .../site-packages
    std::string p = info.dli_fname;
    for (int i = 0; i < 3 && p.find('/') != std::string::npos; ++i) p.erase(p.rfind('/'));
    out.push_back(p + "/nvidia/cu13/lib/libnvjpeg.so.13");
    out.push_back(p + "/nvidia/nvjpeg/lib/libnvjpeg.so.13");
    if (DIR* dir = opendir((p + "/torchvision.libs").c_str())) {
      while (const dirent* e = readdir(dir)) {
        const std::string name = e->d_name;
        if (name.rfind("libnvjpeg", 0) == 0 && name.find(".so.13") != std::string::npos)
          out.push_back(p + "/torchvision.libs/" + name);
      }
      closedir(dir);
    }
  }
  return out;
}

const NvjpegApi& api() {
  static const NvjpegApi a = [] {
    NvjpegApi r;
    void* lib = nullptr;
    for (const auto& path : library_candidates()) {
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        r.path = path;
        break;
      }
    }
    if (!lib) {
      r.error = "libnvjpeg.so.13 not found (CUDA toolkit lib64, LD_LIBRARY_PATH)";
      return r;
    }
    auto sym = [&](auto& fn, const char* name, bool required) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && required && r.error.empty()) r.error = r.path + " has no symbol " + name;
    };
    sym(r.CreateEx, "nvjpegCreateEx", true);
    sym(r.JpegStateCreate, "nvjpegJpegStateCreate", true);
    sym(r.JpegStateDestroy, "nvjpegJpegStateDestroy", true);
    sym(r.Decode, "nvjpegDecode", true);
    sym(r.DecodeBatchedInitialize, "nvjpegDecodeBatchedInitialize", true);
    sym(r.DecodeBatched, "nvjpegDecodeBatched", true);
    sym(r.JpegStreamCreate, "nvjpegJpegStreamCreate", true);
    sym(r.JpegStreamParse, "nvjpegJpegStreamParse", true);
    sym(r.DecodeBatchedSupported, "nvjpegDecodeBatchedSupported", true);
    sym(r.GetHardwareDecoderInfo, "nvjpegGetHardwareDecoderInfo", false);
    return r;
  }();
  return a;
}

inline constexpr const char* kDeclineRejected = "nvjpeg: rejected by nvJPEG (bad or unsupported)";
inline constexpr const char* kDeclineHardware = "nvjpeg: not supported by the hardware decoder";
inline constexpr const char* kDeclineHost = "nvjpeg: host output requested";

inline constexpr const char* kDeclineBatchHybrid =
    "nvjpeg: batched decode without the hardware backend";

/// One decoding state (with its parsed-stream object for the hardware support check).
struct DecodeState {
  State_t state = nullptr;
  Stream_t stream = nullptr;
  /// The batch size of the last nvjpegDecodeBatchedInitialize (nvjpegDecodeBatched decodes
  /// exactly that many images: it takes no count); 0: not initialised, or a failure since.
  int batch_size = 0;
};

/// One device's library handle and its pool of states. Never destroyed (the process's lifetime:
/// destroying nvJPEG objects during static destruction races the CUDA runtime's own teardown).
struct DeviceDecoder {
  int device = 0;
  Handle_t handle = nullptr;
  bool hardware = false;
  std::mutex mu;
  std::vector<DecodeState*> free_states;

  /// A free state, preferably one initialised for `batch` images (a state re-initialised for
  /// another size reallocates its buffers), else a new one: the pool holds as many states as
  /// callers ever decoded at once. (Keeping states apart by batch size made more states than
  /// callers, and the hardware decoder then failed decodes with an allocator error:
  /// NvjpegDecode.ConcurrentCallersGetTheSamePixels on an H100, 2026-12-06.)
  DecodeState* acquire(int batch) {
    if (DecodeState* s = take_sized(batch)) return s;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!free_states.empty()) {
        DecodeState* s = free_states.back();
        free_states.pop_back();
        return s;
      }
    }
    auto s = std::make_unique<DecodeState>();
    check(api().JpegStateCreate(handle, &s->state), "nvjpegJpegStateCreate");
    if (hardware) {
      const auto status = api().JpegStreamCreate(handle, &s->stream);
      if (status != kSuccess) api().JpegStateDestroy(s->state);  // the state is not pooled
      check(status, "nvjpegJpegStreamCreate");
    }
    return s.release();
  }
  /// A free state initialised for `batch` images, or nullptr.
  DecodeState* take_sized(int batch) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto j = free_states.begin(); j != free_states.end(); ++j)
      if ((*j)->batch_size == batch) {
        DecodeState* s = *j;
        free_states.erase(j);
        return s;
      }
    return nullptr;
  }
  void release(DecodeState* s) {
    std::lock_guard<std::mutex> lock(mu);
    free_states.push_back(s);
  }
  /// nvjpegDecodeBatchedInitialize for `batch` images, unless `s` is already.
  void initialise_batch(DecodeState* s, int batch) const {
    if (s->batch_size == batch) return;
    s->batch_size = 0;
    check(api().DecodeBatchedInitialize(handle, s->state, batch, 1, kOutputRgb),
          "nvjpegDecodeBatchedInitialize");
    s->batch_size = batch;
  }
  /// Borrows a state for one call, returned to the pool when it goes out of scope.
  struct Lease {
    DeviceDecoder& d;
    DecodeState* s;
    Lease(DeviceDecoder& dec, int batch) : d(dec), s(dec.acquire(batch)) {}
    ~Lease() { d.release(s); }
    /// Trades the state for a free one initialised for `batch` when there is one: a batch whose
    /// checks declined some images decodes fewer than it was leased for.
    void resize(int batch) {
      if (s->batch_size == batch) return;
      if (DecodeState* other = d.take_sized(batch)) {
        d.release(s);
        s = other;
      }
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
  };
  static void check(nvjpegStatus_t status, const char* what) {
    if (status == kSuccess) return;
    if (status == kAllocatorFailure)  // kernels/out_of_memory.h: "out of memory" in the message
      throw std::runtime_error(std::string("nvjpeg: ") + what + ": out of memory (status 5)");
    throw std::runtime_error(std::string("nvjpeg: ") + what + " failed with status " +
                             std::to_string(status));
  }
};

DeviceDecoder& decoder_for(int device) {
  static std::mutex mu;
  static std::map<int, DeviceDecoder*> decoders;
  std::lock_guard<std::mutex> lock(mu);
  auto it = decoders.find(device);
  if (it != decoders.end()) return *it->second;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  auto d = std::make_unique<DeviceDecoder>();
  d->device = device;
  const auto& a = api();
  unsigned engines = 0, cores = 0;
  if (a.CreateEx(kBackendHardware, nullptr, nullptr, 0, &d->handle) == kSuccess) {
    d->hardware = true;
    if (a.GetHardwareDecoderInfo &&
        (a.GetHardwareDecoderInfo(d->handle, &engines, &cores) != kSuccess || engines == 0)) {
      d->hardware = false;  // the handle stays unused (never destroyed: see DeviceDecoder)
      d->handle = nullptr;
    }
  } else {
    d->handle = nullptr;
  }
  if (!d->hardware) {
    DeviceDecoder::check(a.CreateEx(kBackendDefault, nullptr, nullptr, 0, &d->handle),
                         "nvjpegCreateEx");
  }
  log::info("nvjpeg: cuda:" + std::to_string(device) + " decodes with " +
            (d->hardware ? "the hardware backend (" + std::to_string(engines) + " engines, " +
                               std::to_string(cores) + " cores each)"
                         : std::string("the default (hybrid) backend")) +
            ", " + a.path);
  return *(decoders[device] = d.release());
}

/// `image` (3, H, W) as PIL's Image.transpose gives it for EXIF orientation `o`
/// (models/image/decode.cpp apply_orientation, here with ATen on the device).
at::Tensor orient(const at::Tensor& image, int o) {
  switch (o) {
    case 2:
      return image.flip({2});
    case 3:
      return image.flip({1, 2});
    case 4:
      return image.flip({1});
    case 5:
      return image.transpose(1, 2).contiguous();
    case 6:
      return image.transpose(1, 2).flip({2});
    case 7:
      return image.transpose(1, 2).flip({1, 2});
    case 8:
      return image.transpose(1, 2).flip({1});
    default:
      return image;
  }
}

/// What `dec` cannot decode of `header`'s image (kernels/image/jpeg_header.h), or nullptr.
const char* decline_reason(const DeviceDecoder& dec, const image::JpegHeader& header,
                           const ImageDecodeOptions& options) {
  image::BaselineSupport support;
  support.s411_s410 = !dec.hardware;  // the hardware backend does not take 4:1:1 / 4:1:0
  support.max_pixels = options.max_pixels;
  return image::baseline_decline_reason(header, support);
}

bool rejected_by_nvjpeg(nvjpegStatus_t status) {
  return status == kBadJpeg || status == kJpegNotSupported || status == kIncompleteBitstream ||
         status == kImplementationNotSupported;
}

/// On the hardware backend: nullptr when nvJPEG parses `in` and its batched decoder takes it,
/// else the reason (parsed into `st`'s stream object).
const char* hardware_decline_reason(const DeviceDecoder& dec, DecodeState* st,
                                    const EncodedImage& in) {
  const auto& a = api();
  const nvjpegStatus_t status = a.JpegStreamParse(dec.handle, in.data, in.size, 0, 0, st->stream);
  if (rejected_by_nvjpeg(status)) return kDeclineRejected;
  DeviceDecoder::check(status, "nvjpegJpegStreamParse");
  int unsupported = 1;  // nvJPEG: 0 means supported
  DeviceDecoder::check(a.DecodeBatchedSupported(dec.handle, st->stream, &unsupported),
                       "nvjpegDecodeBatchedSupported");
  return unsupported != 0 ? kDeclineHardware : nullptr;
}

/// A (3, h, w) planar RGB destination for nvJPEG at `p`.
nvjpegImage_t planar_rgb(uint8_t* p, int64_t h, int64_t w) {
  nvjpegImage_t dst{};
  for (int c = 0; c < 3; ++c) {
    dst.channel[c] = p + c * h * w;
    dst.pitch[c] = static_cast<size_t>(w);
  }
  return dst;
}

Outcome<DecodedImage> nvjpeg_decode(const EncodedImage& in, const ImageDecodeOptions& options) {
  const image::JpegHeader header = image::parse_jpeg_header(in.data, in.size);
  if (options.device_index < 0) return Decline{kDeclineHost};
  DeviceDecoder& dec = decoder_for(options.device_index);
  if (const char* why = decline_reason(dec, header, options)) return Decline{why};

  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(options.device_index));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(options.device_index).stream();
  const int64_t h = header.height, w = header.width;
  at::Tensor out = at::empty(
      {3, h, w}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, options.device_index));
  nvjpegImage_t dst = planar_rgb(out.data_ptr<uint8_t>(), h, w);
  const auto& a = api();
  const DeviceDecoder::Lease lease(dec, 1);
  DecodeState* st = lease.s;
  nvjpegStatus_t status = kSuccess;
  if (dec.hardware) {
    if (const char* why = hardware_decline_reason(dec, st, in)) return Decline{why};
    dec.initialise_batch(st, 1);
    const unsigned char* data = in.data;
    const size_t length = in.size;
    status = a.DecodeBatched(dec.handle, st->state, &data, &length, &dst, stream);
    if (status != kSuccess) st->batch_size = 0;  // nvJPEG: re-initialise after a failure
  } else {
    status = a.Decode(dec.handle, st->state, in.data, in.size, kOutputRgb, &dst, stream);
  }
  if (rejected_by_nvjpeg(status)) return Decline{kDeclineRejected};
  DeviceDecoder::check(status, dec.hardware ? "nvjpegDecodeBatched" : "nvjpegDecode");
  // The caller's bytes and the state's buffers are reused once this returns: wait for the
  // decode (and surface an asynchronous error here, where it disables this implementation).
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  DecodedImage result;
  result.pixels = orient(out, options.orientation).contiguous();
  return result;
}

/// `image_decode_batch`: the images nvjpeg_decode would take, checked as it checks them, then
/// one nvjpegDecodeBatched call on the hardware backend into one device buffer (each image a
/// (3, H, W) view of it, or its oriented copy). The others come back empty (decode_images sends
/// them through `image_decode`, where their decline is counted); so does the whole batch when
/// nvJPEG refuses it as a whole (a stream that passed the checks but fails to decode).
Outcome<std::vector<DecodedImage>> nvjpeg_decode_batch(const std::vector<EncodedImage>& in,
                                                       const std::vector<int>& orientations,
                                                       const ImageDecodeOptions& options) {
  if (orientations.size() != in.size())
    throw std::invalid_argument("nvjpeg: " + std::to_string(orientations.size()) +
                                " orientations for " + std::to_string(in.size()) + " images");
  if (options.device_index < 0) return Decline{kDeclineHost};
  DeviceDecoder& dec = decoder_for(options.device_index);
  if (!dec.hardware) return Decline{kDeclineBatchHybrid};
  std::vector<DecodedImage> out(in.size());
  if (in.empty()) return out;

  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(options.device_index));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(options.device_index).stream();
  std::vector<std::size_t> taken;  // indices into `in`
  std::vector<int64_t> offsets;    // of each taken image in the buffer, bytes
  int64_t total = 0;
  std::vector<std::pair<int64_t, int64_t>> sizes;  // (h, w) of each taken image
  for (std::size_t i = 0; i < in.size(); ++i) {
    const image::JpegHeader header = image::parse_jpeg_header(in[i].data, in[i].size);
    if (decline_reason(dec, header, options)) continue;
    taken.push_back(i);
    sizes.emplace_back(header.height, header.width);
  }
  if (taken.empty()) return out;
  // The hardware check parses each stream into a state's nvjpegJpegStream.
  DeviceDecoder::Lease lease(dec, static_cast<int>(taken.size()));
  std::size_t kept = 0;
  for (std::size_t k = 0; k < taken.size(); ++k) {
    if (hardware_decline_reason(dec, lease.s, in[taken[k]])) continue;
    taken[kept] = taken[k];
    sizes[kept++] = sizes[k];
  }
  taken.resize(kept);
  sizes.resize(kept);
  if (taken.empty()) return out;
  for (const auto& [h, w] : sizes) {
    offsets.push_back(total);
    total += int64_t{3} * h * w;
  }
  lease.resize(static_cast<int>(taken.size()));
  DecodeState* st = lease.s;

  const at::Tensor buffer = at::empty(
      {total}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, options.device_index));
  std::vector<const unsigned char*> data;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> dst;
  for (std::size_t k = 0; k < taken.size(); ++k) {
    data.push_back(in[taken[k]].data);
    lengths.push_back(in[taken[k]].size);
    dst.push_back(
        planar_rgb(buffer.data_ptr<uint8_t>() + offsets[k], sizes[k].first, sizes[k].second));
  }
  dec.initialise_batch(st, static_cast<int>(taken.size()));
  const nvjpegStatus_t status =
      api().DecodeBatched(dec.handle, st->state, data.data(), lengths.data(), dst.data(), stream);
  if (status != kSuccess) st->batch_size = 0;  // nvJPEG: re-initialise after a failure
  if (rejected_by_nvjpeg(status)) return out;  // one by one through image_decode
  DeviceDecoder::check(status, "nvjpegDecodeBatched");
  // As nvjpeg_decode: the caller's bytes and the state's buffers are reused once this returns.
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  bool copied = false;
  for (std::size_t k = 0; k < taken.size(); ++k) {
    const auto [h, w] = sizes[k];
    const at::Tensor image = buffer.narrow(0, offsets[k], 3 * h * w).view({3, h, w});
    const int o = orientations[taken[k]];
    out[taken[k]].pixels = orient(image, o).contiguous();
    copied = copied || (o >= 2 && o <= 8);
  }
  // The server reads a batch's images on other streams (the instance's): the oriented copies
  // must be finished when this returns, as the decode is.
  if (copied) C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

class NvjpegProvider : public Provider {
 public:
  std::string name() const override { return "nvjpeg"; }
  const char* unavailable() const override {
    if (!at::cuda::is_available()) return "no usable CUDA device";
    const auto& a = api();
    return a.error.empty() ? nullptr : a.error.c_str();  // api() is a static: the text lives on
  }
  void load(Registry& registry) override {
    registry.register_impl(
        kImageDecode, "nvjpeg", ImageDecodeImpl(&nvjpeg_decode),
        [] { return at::cuda::is_available() && api().error.empty(); }, cuda_models_only);
    registry.register_impl(
        kImageDecodeBatch, "nvjpeg", ImageDecodeBatchImpl(&nvjpeg_decode_batch),
        [] { return at::cuda::is_available() && api().error.empty(); }, cuda_models_only);
  }
};

}  // namespace

std::shared_ptr<Provider> make_nvjpeg_provider() { return std::make_shared<NvjpegProvider>(); }

}  // namespace libreyolo::kernels
