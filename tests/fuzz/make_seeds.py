#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz, docs/FUZZING.md) under
tests/fuzz/corpus/<target>/ from the repository's fixtures and the tests' hostile inputs.

Run from the repository root with the set-up's virtual environment (Pillow and tritonclient's
protobuf classes, wire-compatible with proto/inference/grpc_predict_v2.proto):
    ~/.cache/libreyolo-server/venv-torch2.11/bin/python tests/fuzz/make_seeds.py
Deterministic: the same files every run. safetensors/ (hand-made) and regression inputs
(regress-*, one per fixed finding) are kept as they are.
"""
import io
import json
import pathlib
import struct
import zlib

from PIL import Image
from tritonclient.grpc import service_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures"
OUT = ROOT / "tests/fuzz/corpus"


def write(target, name, data):
    if target == "config_json":  # model_config reads the same files through the families
        write("model_config", name, data)
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(w, h):
    ihdr = struct.pack(">II", w, h) + b"\x08\x02\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b"")


def jpeg_claiming(jpeg, w, h):
    # Rewrites the first SOF0/SOF2 frame header's height and width.
    i = 2
    while i + 4 < len(jpeg):
        marker, length = jpeg[i + 1], struct.unpack(">H", jpeg[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC2):
            return jpeg[:i + 5] + struct.pack(">HH", h, w) + jpeg[i + 9:]
        i += 2 + length
    raise ValueError("no SOF")


def encoded(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def small_images():
    """Small images in every mode the decoder converts (decode.h: grayscale, palette, alpha,
    16-bit, CMYK, progressive, interlaced)."""
    base = Image.open(FIX / "images/chelsea.jpg").convert("RGB").resize((24, 16))
    out = {
        "rgb.jpg": encoded(base, "JPEG", quality=80),
        "gray.jpg": encoded(base.convert("L"), "JPEG"),
        "cmyk.jpg": encoded(base.convert("CMYK"), "JPEG"),
        "progressive.jpg": encoded(base, "JPEG", progressive=True),
        "subsampled_444.jpg": encoded(base, "JPEG", subsampling=0),
        "rgb.png": encoded(base, "PNG"),
        "rgba.png": encoded(base.convert("RGBA"), "PNG"),
        "gray.png": encoded(base.convert("L"), "PNG"),
        "gray_alpha.png": encoded(base.convert("LA"), "PNG"),
        "palette.png": encoded(base.convert("P"), "PNG"),
        "bilevel.png": encoded(base.convert("1"), "PNG"),
        "gray16.png": encoded(base.convert("I;16"), "PNG"),
        "one_pixel.png": encoded(Image.new("RGB", (1, 1), (9, 8, 7)), "PNG"),
        "thin_40000x1.png": encoded(Image.new("L", (4000, 1), 3), "PNG"),
    }
    for p in sorted((FIX / "images/exif").glob("*.jpg")) + sorted((FIX / "images/exif").glob("*.png")):
        out["exif_" + p.name] = p.read_bytes()
    return out


def images():
    imgs = small_images()
    photo = (FIX / "images/chelsea.jpg").read_bytes()
    hostile = {
        "png_claiming_60000x60000.png": png_claiming(60000, 60000),
        "jpeg_claiming_65000x65000.jpg": jpeg_claiming(imgs["rgb.jpg"], 65000, 65000),
        "jpeg_truncated.jpg": imgs["rgb.jpg"][: len(imgs["rgb.jpg"]) // 2],
        "jpeg_header_only.jpg": photo[:200],
        "png_truncated.png": imgs["rgb.png"][: len(imgs["rgb.png"]) // 2],
        "garbage.bin": b"\x42" * 64,
        "empty.bin": b"",
    }
    return imgs, hostile, photo


def oip_requests(jpeg):
    def req(model, inputs, raw=None, params=None, outputs=()):
        r = pb.ModelInferRequest(model_name=model, id="seed")
        for name, dt, shape in inputs:
            t = r.inputs.add(name=name, datatype=dt)
            t.shape.extend(shape)
        for k, v in (params or {}).items():
            p = r.parameters[k]
            if isinstance(v, bool):
                p.bool_param = v
            elif isinstance(v, int):
                p.int64_param = v
            elif isinstance(v, float):
                p.double_param = v
            else:
                p.string_param = v
        for o in outputs:
            r.outputs.add(name=o)
        if raw is not None:
            r.raw_input_contents.extend(raw)
        return r

    def pack(*blobs):
        return b"".join(struct.pack("<I", len(b)) + b for b in blobs)

    def floats(n, v=0.5):
        return struct.pack("<%df" % n, *([v] * n))

    seeds = {}
    for model in ("fake_detector", "fake_classifier", "fake_segmenter"):
        seeds[model + "_images"] = req(model, [("images", "BYTES", [1])], [pack(jpeg)])
        seeds[model + "_two_images"] = req(model, [("images", "BYTES", [2])], [pack(jpeg, jpeg)])
        seeds[model + "_pixels"] = req(model, [("pixel_values", "FP32", [1, 3, 4, 4])], [floats(48)])
        typed = req(model, [("pixel_values", "FP32", [1, 3, 2, 2])])
        typed.inputs[0].contents.fp32_contents.extend([0.25] * 12)
        seeds[model + "_typed_fp32"] = typed
        typed_b = req(model, [("images", "BYTES", [1])])
        typed_b.inputs[0].contents.bytes_contents.append(jpeg)
        seeds[model + "_typed_bytes"] = typed_b
        seeds[model + "_top_k"] = req(model, [("images", "BYTES", [1])], [pack(jpeg)],
                                      {"top_k": 2})
    d = "fake_detector"
    seeds["detector_params"] = req(d, [("images", "BYTES", [1])], [pack(jpeg)],
                                   {"threshold": 0.25, "top_k": 3},
                                   ("scores", "labels", "boxes", "num_detections", "label_names",
                                    "logits", "pred_boxes"))
    seeds["detector_target_sizes"] = req(
        d, [("images", "BYTES", [1]), ("target_sizes", "INT64", [1, 2])],
        [pack(jpeg), struct.pack("<2q", 480, 640)])
    seeds["detector_pixels_target_sizes"] = req(
        d, [("pixel_values", "FP32", [1, 3, 4, 4]), ("target_sizes", "INT64", [1, 2])],
        [floats(48), struct.pack("<2q", 4, 4)])
    # tests/integration/server_hostile_test.cpp MalformedRequestsAreInvalidArgument
    seeds["hostile_2p32_pixels"] = req(d, [("pixel_values", "FP32", [1, 3, 2**32, 2**32])], [b""])
    seeds["hostile_negative_batch"] = req(d, [("pixel_values", "FP32", [-1, 3, 2, 2])], [floats(12)])
    seeds["hostile_2p62_images"] = req(d, [("pixel_values", "FP32", [2**62, 3, 2, 2])], [b""])
    seeds["hostile_short_data"] = req(d, [("pixel_values", "FP32", [1, 3, 2, 2])], [floats(11)])
    seeds["hostile_two_raw"] = req(d, [("pixel_values", "FP32", [1, 3, 2, 2])],
                                   [floats(12), floats(12)])
    seeds["hostile_bytes_length"] = req(d, [("images", "BYTES", [1])], [b"\xff\xff\xff\xffabc"])
    seeds["hostile_bytes_cut"] = req(d, [("images", "BYTES", [1])], [b"\x05\x00"])
    seeds["hostile_duplicate"] = req(d, [("images", "BYTES", [1]), ("images", "BYTES", [1])],
                                     [pack(jpeg), pack(jpeg)])
    seeds["hostile_unknown_output"] = req(d, [("images", "BYTES", [1])], [pack(jpeg)],
                                          outputs=("nope",))
    seeds["hostile_threshold_nan"] = req(d, [("images", "BYTES", [1])], [pack(jpeg)],
                                         {"threshold": float("nan")})
    seeds["hostile_top_k_string"] = req(d, [("images", "BYTES", [1])], [pack(jpeg)], {"top_k": "5"})
    seeds["hostile_target_size_negative"] = req(
        d, [("images", "BYTES", [1]), ("target_sizes", "INT64", [1, 2])],
        [pack(jpeg), struct.pack("<2q", -1, 5)])
    seeds["hostile_classifier_target_sizes"] = req(
        "fake_classifier", [("images", "BYTES", [1]), ("target_sizes", "INT64", [1, 2])],
        [pack(jpeg), struct.pack("<2q", 1, 1)])
    seeds["hostile_png_bomb"] = req(d, [("images", "BYTES", [1])], [pack(png_claiming(60000, 60000))])
    seeds["hostile_unknown_model"] = req("nope", [("images", "BYTES", [1])], [pack(jpeg)])
    s = "fake_segmenter"
    seeds["segmenter_rle_target_sizes"] = req(
        s, [("pixel_values", "FP32", [1, 3, 4, 4]), ("target_sizes", "INT64", [1, 2])],
        [floats(48), struct.pack("<2q", 7, 5)], {"mask_format": "rle", "mask_threshold": 0.5})
    seeds["segmenter_outputs"] = req(s, [("images", "BYTES", [1])], [pack(jpeg)], {"top_k": 3},
                                     ("masks", "rle_counts", "rle_size", "boxes"))
    seeds["hostile_mask_format"] = req(s, [("images", "BYTES", [1])], [pack(jpeg)],
                                       {"mask_format": "png"})
    # Regression (oip_request_fuzz, docs/FUZZING.md "Findings"): target sizes whose mask pixels overflow int64
    # reached a double -> integer cast (UB) in the budget's error message.
    seeds["regress_segmenter_huge_target_sizes"] = req(
        s, [("pixel_values", "FP32", [1, 3, 4, 4]), ("target_sizes", "INT64", [1, 2])],
        [floats(48), struct.pack("<2q", 4 * 10**18, 4 * 10**18)])
    seeds["hostile_fp16"] = req(d, [("pixel_values", "FP16", [1, 3, 2, 2])], [b"\0" * 24])
    return {k: v.SerializeToString(deterministic=True) for k, v in seeds.items()}


def http_requests():
    """What clients send to the HTTP port (http_request_fuzz.cpp's routes), one connection each."""
    head = json.dumps({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 8}}]})
    body_json = json.dumps({"inputs": [{"name": "target_sizes", "datatype": "INT64",
                                        "shape": [1, 2], "data": [400, 600]}]})
    binary = head.encode() + struct.pack("<I", 4) + b"\xff\xd8\xff\xd9"
    multipart = ("--XyZ\r\nContent-Disposition: form-data; name=\"a\"; filename=\"a.txt\"\r\n"
                 "Content-Type: text/plain\r\n\r\nhello\r\n--XyZ--\r\n")
    get = "GET /v2/health/ready HTTP/1.1\r\nHost: localhost:8000\r\n\r\n"
    return {
        "get_health.http": get,
        "head_health.http": "HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        "post_infer_json.http": "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                                "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(body_json), body_json),
        "post_infer_binary.http": (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                                   b"Content-Type: application/octet-stream\r\n"
                                   b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                                   % (len(head), len(binary))) + binary,
        "post_infer_chunked.http": "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n"
                                   "5\r\n{\"inp\r\n4;ext=1\r\nuts\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n"
                                   "Trailer: x\r\n\r\n",
        "post_form_multipart.http": "POST /form HTTP/1.1\r\nHost: x\r\n"
                                    "Content-Type: multipart/form-data; boundary=XyZ\r\n"
                                    "Content-Length: %d\r\n\r\n%s" % (len(multipart), multipart),
        "post_form_urlencoded.http": "POST /form HTTP/1.1\r\nContent-Type: "
                                     "application/x-www-form-urlencoded\r\nContent-Length: 7\r\n\r\na=1&b=2",
        "pipelined_keep_alive.http": get + "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
                                     + "GET /big HTTP/1.1\r\n\r\n" + get
                                     + "GET /v2/health/ready?x=%20 HTTP/1.0\r\nConnection: close\r\n\r\n",
        "expect_100_continue.http": "POST /v2/models/m/infer HTTP/1.1\r\nExpect: 100-continue\r\n"
                                    "Content-Length: 2\r\n\r\n{}",
        "close_before_body.http": "POST /close HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello" + get,
        "too_large.http": "POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "2000\r\n" + "x" * 0x2000 + "\r\n0\r\n\r\n",
        "ranges.http": "GET /v2/health/ready HTTP/1.1\r\nRange: garbage\r\n\r\n"
                       "GET /v2/health/ready HTTP/1.1\r\nrAnGe: bytes=5-2\r\n\r\n"
                       "GET /big HTTP/1.1\r\nRange: bytes=999999-\r\n\r\n"
                       "GET /big HTTP/1.1\r\nRange: bytes=0-1,3-4\r\n\r\n",
        "http09.http": "GET /v2/health/ready\r\n\r\n",
    }


def tls_client_hellos():
    """A client's first flights to the TLS front (tls_front_fuzz.cpp: 1 byte, bit 0 mutual TLS,
    then the bytes), from a real handshake of Python's ssl (OpenSSL) in memory: TLS 1.3 and 1.2
    ClientHellos, and for TLS 1.2 with a client certificate the ClientHello followed by the
    client's second flight (Certificate, ClientKeyExchange, CertificateVerify, Finished). The
    client random differs per run: written only when absent."""
    import ssl
    import subprocess
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as d:
        cert, key = d + "/c.pem", d + "/k.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost", "-days",
                        "3650", "-keyout", key, "-out", cert], check=True, capture_output=True)
        for name, version, mutual in (("tls13", ssl.TLSVersion.TLSv1_3, False),
                                      ("tls12", ssl.TLSVersion.TLSv1_2, False),
                                      ("tls12_client_cert", ssl.TLSVersion.TLSv1_2, True)):
            cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            cctx.load_verify_locations(cert)
            cctx.minimum_version = cctx.maximum_version = version
            sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            sctx.load_cert_chain(cert, key)
            if mutual:
                cctx.load_cert_chain(cert, key)
                sctx.verify_mode = ssl.CERT_REQUIRED
                sctx.load_verify_locations(cert)
            c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
            client = cctx.wrap_bio(c_in, c_out, server_hostname="localhost")
            server = sctx.wrap_bio(s_in, s_out, server_side=True)
            flights = []
            for _ in range(4):
                for side in (client, server):
                    try:
                        side.do_handshake()
                    except ssl.SSLWantReadError:
                        pass
                data = c_out.read()
                if data:
                    flights.append(data)
                s_in.write(data)
                c_in.write(s_out.read())
            out[name] = bytes([1 if mutual else 0]) + b"".join(flights[:2] if mutual else flights[:1])
    return out


def tokenizer_seeds():
    """Every 10th fixture string of tests/fixtures/tokenizers (ASCII, Grounding DINO prompts,
    many scripts, emoji, controls, long strings) and invalid UTF-8."""
    strings = json.loads((FIX / "tokenizers/strings.json").read_text(encoding="utf-8"))
    seeds = {f"string_{i:04d}.txt": s.encode() for i, s in enumerate(strings) if i % 10 == 0}
    seeds["prompt.txt"] = b"a cat. a remote control."
    seeds["specials.txt"] = "[CLS] a [MASK]<|startoftext|>x<|endoftext|>".encode()
    seeds["hostile_invalid_utf8.txt"] = b"a cat\xe2\x82 \xed\xa0\x80 \xc0\xaf \xff"
    seeds["hostile_long_word.txt"] = b"a" * 8000
    seeds["hostile_marks.txt"] = "e" + "\u0301\u0323" * 1500
    return seeds


def main():
    for target in ("bert_tokenizer", "clip_tokenizer"):
        for name, data in tokenizer_seeds().items():
            write(target, name, data)
    for name, data in http_requests().items():
        write("http_request", name, data)
    if not (OUT / "tls_front").is_dir():
        for name, data in tls_client_hellos().items():
            write("tls_front", name + ".bin", data)

    imgs, hostile, photo = images()
    for name, data in {**imgs, **hostile}.items():
        write("image_decode", name, data)
    write("image_decode", "photo_chelsea.jpg", photo)
    for i, (name, data) in enumerate(sorted({**imgs, **hostile}.items())):
        write("preprocess", name, bytes([i % 5]) + data)
    for k in range(5):  # one per processor of preprocess_fuzz.cpp
        write("preprocess", "photo_chelsea_%d.jpg" % k, bytes([k]) + photo)

    # jpeg_header: the small files of the committed JPEG set (tests/fixtures/images/jpeg_set:
    # every subsampling, grayscale, progressive, restart markers, CMYK, truncated) and the
    # image_decode seeds that are JPEGs (hostile ones included).
    for f in sorted((FIX / "images/jpeg_set").glob("*.jpg")):
        if f.stat().st_size <= 8000 or not f.name.startswith("q"):
            write("jpeg_header", f.name, f.read_bytes())
    for name, data in {**imgs, **hostile}.items():
        if data[:2] == b"\xff\xd8":
            write("jpeg_header", name, data)

    jpeg = imgs["rgb.jpg"]
    for name, data in oip_requests(jpeg).items():
        write("oip_request", name + ".pb", data)

    for m in sorted((FIX / "models").iterdir()):
        for f in ("config.json", "preprocessor_config.json"):
            if (m / f).exists():
                write("config_json", m.name + "_" + f, (m / f).read_bytes())
    write("config_json", "hostile_huge_number.json", '{"model_type": "rt_detr", "d_model": 1' + "0" * 400 + "}")
    write("config_json", "hostile_nested.json", "[" * 2000 + "]" * 2000)
    write("config_json", "hostile_id2label.json", '{"id2label": {"x": "a", "1": 2}}')
    write("config_json", "hostile_float_ints.json", '{"model_type": "rt_detr", "d_model": 1e300, "num_queries": -5.0}')
    write("config_json", "hostile_processor_size.json",
          '{"image_processor_type": "DeformableDetrImageProcessor", "size": {"shortest_edge": 9000000000000000000, "longest_edge": 1}}')

    write("server_yaml", "server.yaml", (ROOT / "config/server.yaml").read_bytes())
    write("server_yaml", "empty.yaml", "")
    write("server_yaml", "hostile_threads.yaml", "server:\n  preprocess_threads: 1000000000\n")
    write("server_yaml", "hostile_drain_nan.yaml", "server:\n  drain_seconds: .nan\n")
    write("server_yaml", "hostile_big_int.yaml", "server:\n  max_message_bytes: 99999999999999999999999\n")
    write("server_yaml", "hostile_nested.yaml", "server: " + "[" * 3000 + "]" * 3000 + "\n")
    write("server_yaml", "hostile_aliases.yaml", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n")
    write("server_yaml", "hostile_bom.yaml", b"\xff\xfe\x00\x01garbage")
    write("server_yaml", "kernels_slots.yaml",
          "kernels:\n  selection: auto\n  hub_kernels: off\n  fused_attention: on\n  layouts: on\n"
          "  slots:\n    ms_deform_attn: {allow: [cuda, hub, reference]}\n"
          "  hub:\n    offline: true\n    lock_file: kernels.lock\n    cache_dir: ../cache\n"
          "model_repository: ../models\ndevice: cuda:1\ntf32: off\n"
          "server:\n  grpc_address: 127.0.0.1:9001\n  http_address: \"off\"\n  model_control: explicit\n"
          "  log_level: warn\n  max_concurrent_rpcs: 4\n")
    write("server_yaml", "dtype.yaml", "device: cpu\ndtype: bfloat16\n")

    for p in sorted((ROOT / "examples/model_repository").glob("*/serving.yaml")):
        write("serving_yaml", p.parent.name + ".yaml", p.read_bytes())
    write("serving_yaml", "empty.yaml", "")
    write("serving_yaml", "kernel_config.yaml",
          "kernel_config:\n  RTDetrConvNormLayer: batchnorm_fold\n  RTDetrResNetConvLayer: off\n"
          "  RTDetrRepVggBlock: repvgg\n  \"RTDetrConvNormLayer@model.encoder.*\": off\n"
          "kernels:\n  slots:\n    ms_deform_attn: {allow: [reference]}\n  layouts: on\n"
          "fused_attention: off\ncuda_graphs: on\ndtype: bfloat16\n")
    write("serving_yaml", "hostile_values.yaml",
          "max_batch_size: 0\nthreshold: .nan\ntop_k: -1\nmax_queue_size: 99999999999\n"
          "dtype: float8\nkernel_config:\n  owner/repo:Class: repvgg\n")

    write("hub_lock", "empty_list.lock", "[]\n")
    write("hub_lock", "entry.lock", json.dumps([{
        "repo_id": "kernels-community/deformable-detr", "revision": "a" * 40, "sha": "a" * 40,
        "slot": "ms_deform_attn",
        "variants": {"torch211-cxx11-cu130-x86_64-linux": {"files": {
            "__init__.py": "sha256:" + "0" * 64, "_ops.py": "1" * 64}}}}], indent=2))
    write("hub_lock", "hostile_paths.lock", json.dumps([{
        "repo_id": "../../etc", "variants": {"..": {"files": {"/etc/passwd": "x"}}}}]))
    write("hub_lock", "hostile_types.lock", '[{"repo_id": 5, "variants": []}, 7]')
    # huggingface/kernels' own format (`kernels lock`, locking.py), and LOCAL_KERNELS values.
    write("hub_lock", "upstream.lock", json.dumps([{
        "repo_id": "kernels-community/deformable-detr", "sha": "3f2c" + "0" * 36,
        "variants": {"torch211-cxx11-cu130-x86_64-linux": {
            "hash": "sha256-" + "ab" * 32, "hash_type": "git_lfs_concat"},
            "torch-stable-abi29-cpu-x86_64-linux": {"hash": "sha256-" + "cd" * 32}}}], indent=2))
    write("hub_lock", "upstream_mixed.lock", json.dumps([{
        "repo_id": "a/b", "version": 1, "variants": {"torch-cuda": {
            "files": {"__init__.py": "0" * 64}, "hash": "sha256-" + "0" * 64,
            "hash_type": "sha1"}}}]))
    write("hub_lock", "local_kernels.txt", "kernels-community/activation=devel/activation:"
          "kernels-community/flash-attn2=devel/flash-attn2")

    meta = (ROOT / "tests/hub/metadata.json.in").read_text().replace("@HUB_TEST_ID@", "_libreyolo_hubtest_0")
    write("hub_metadata", "hubtest.json", meta)
    write("hub_metadata", "cuda.json", (ROOT / "tests/hub/metadata_cuda.json.in").read_text()
          .replace("@HUB_TEST_ID@", "_libreyolo_hubtest_cuda_0").replace("@HUB_TEST_ARCHS@", '"9.0"'))
    write("hub_metadata", "digest.json", json.dumps({
        "id": "_deformable_detr_cuda_1a2b3c4", "name": "deformable-detr",
        "backend": {"type": "cuda", "archs": ["8.0", "9.0+PTX"]},
        "digest": {"algorithm": "sha256", "files": {"_ops.py": "AAAA", "x.so": "BBBB"}}}))
    write("hub_metadata", "hostile_id.json", json.dumps({"id": "a" * 3000 + "-", "backend": {"type": "cpu"}}))
    write("hub_metadata", "hostile_types.json", '{"id": 1, "backend": []}')

    for m in ("vit_tiny", "rtdetr_tiny"):
        data = (FIX / "models" / m / "model.safetensors").read_bytes()
        write("safetensors_file", m + ".safetensors", data)
        n = struct.unpack("<Q", data[:8])[0]
        write("safetensors_file", m + "_header_only.safetensors", data[: 8 + n])
        if m != "vit_tiny":
            continue  # one family's corrupted copies are enough (the corpus stays small)
        write("safetensors_file", m + "_truncated.safetensors", data[: 8 + n + (len(data) - 8 - n) // 2])
        header = json.loads(data[8:8 + n])
        first = sorted(k for k in header if k != "__metadata__")[0]
        header.pop(first)  # a missing tensor
        body = json.dumps(header).encode()
        write("safetensors_file", m + "_missing_key.safetensors",
              struct.pack("<Q", len(body)) + body + data[8 + n:])


if __name__ == "__main__":
    main()
