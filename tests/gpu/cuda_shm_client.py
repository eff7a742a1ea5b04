"""CUDA shared memory through tritonclient.grpc or tritonclient.http (--protocol) against a
running libreyolo-server on the GPU machine: the fixture's pixel_values in a torch CUDA tensor, shared with cudaIpcGetMemHandle
(torch's storage._share_cuda_(), the handle tritonclient.utils.cuda_shared_memory would give),
registered with CudaSharedMemoryRegister (gRPC) or POST /v2/cudasharedmemory/region/{name}/register
(REST, the handle in base64: {"raw_handle": {"b64": ...}}); `scores` and `boxes` are written by the daemon into a
second CUDA region and read back here from the client's own device memory. The detections are
compared with the transformers fixture (tests/fixtures/models/rtdetr_tiny/expected.safetensors,
the bounds of tests/peers/tritonclient_test.py test_fp32_pixel_values).

Run (GPU machine, repository root), against a daemon serving rtdetr_tiny on cuda:
    python3 tests/gpu/cuda_shm_client.py --server 127.0.0.1:8001 [--model rtdetr_tiny]
    python3 tests/gpu/cuda_shm_client.py --protocol http --server 127.0.0.1:8000
or let it start one (both ports): python3 tests/gpu/cuda_shm_client.py --binary build-gpu/bin/libreyolo-server
[--protocol grpc|http|both]; `both` runs every check over each transport in turn.
Exit status 0 when every check passed; prints one line per check.
"""
import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from safetensors.numpy import load_file
from tritonclient.utils import InferenceServerException

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPECTED = os.path.join(ROOT, "tests/fixtures/models/rtdetr_tiny/expected.safetensors")
NUM_QUERIES = 30


def ipc(t):
    """(cudaIpcMemHandle_t in base64, as tritonclient's register_cuda_shared_memory takes it;
    byte offset of `t` in the allocation; bytes from the allocation's start to `t`'s end)."""
    share = t.untyped_storage()._share_cuda_()
    handle, storage_bytes, offset = share[1], share[2], share[3]
    # PyTorch >= 2.4 prefixes the cudaIpcMemHandle_t with two bytes (its shareable-handle
    # version and type: c10/cuda/CUDACachingAllocator.cpp shareIpcHandle).
    if len(handle) == 66:
        handle = handle[2:]
    assert len(handle) == 64, f"cudaIpcMemHandle_t of {len(handle)} bytes"
    return base64.b64encode(handle), offset, offset + storage_bytes


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_daemon(binary, workdir):
    """Starts the daemon with both ports; returns (process, gRPC address, HTTP address)."""
    gp, hp = free_port(), free_port()
    while hp == gp:
        hp = free_port()
    repo = os.path.join(workdir, "repo")
    os.makedirs(os.path.join(repo, "rtdetr_tiny", "1"))
    src = os.path.join(ROOT, "tests/fixtures/models/rtdetr_tiny")
    for f in ("config.json", "model.safetensors", "preprocessor_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(repo, "rtdetr_tiny", "1", f))
    with open(os.path.join(repo, "rtdetr_tiny", "serving.yaml"), "w") as f:
        f.write("device: cuda\nmax_batch_size: 4\n")
    cfg = os.path.join(workdir, "server.yaml")
    with open(cfg, "w") as f:
        f.write(f"server:\n  grpc_address: 127.0.0.1:{gp}\n  http_address: 127.0.0.1:{hp}\n  drain_seconds: 0\n"
                f"model_repository: {repo}\ndevice: cuda\ntf32: off\nkernels:\n  hub_kernels: off\n")
    log = open(os.path.join(workdir, "server.log"), "w")
    p = subprocess.Popen([binary, "--config", cfg], stdout=log, stderr=subprocess.STDOUT,
                         env=dict(os.environ, LIBREYOLO_HUB_KERNELS="0"))
    c = grpcclient.InferenceServerClient(url=f"127.0.0.1:{gp}")
    for _ in range(600):
        try:
            if c.is_server_ready():
                return p, f"127.0.0.1:{gp}", f"127.0.0.1:{hp}"
        except InferenceServerException:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.5)
    raise SystemExit(f"the daemon did not become ready; see {workdir}/server.log")


class Transport:
    """The calls that differ between tritonclient.grpc and tritonclient.http."""

    def __init__(self, protocol, url):
        self.protocol = protocol
        self.m = grpcclient if protocol == "grpc" else httpclient
        self.c = self.m.InferenceServerClient(url=url)

    def register(self, name, handle_b64, byte_size):
        # tritonclient.http puts raw_handle into JSON: it must be text.
        h = handle_b64 if self.protocol == "grpc" else handle_b64.decode()
        self.c.register_cuda_shared_memory(name, h, 0, byte_size)

    def region_names(self):
        status = self.c.get_cuda_shared_memory_status()
        if self.protocol == "grpc":
            return sorted(status.regions)
        return sorted(s["name"] for s in status)

    def status_of(self, code):
        """The exception status of a gRPC code: its name (grpc) or the HTTP status (http),
        as server/http/kserve_json.h http_status maps it."""
        if self.protocol == "grpc":
            return f"StatusCode.{code}"
        return {"ALREADY_EXISTS": "400", "INVALID_ARGUMENT": "400"}[code]


def run_checks(t, model, check):
    c = t.c
    c.unregister_cuda_shared_memory()
    expected = load_file(EXPECTED)
    pixels = torch.from_numpy(expected["pixel_u8"].astype(np.float32) * np.float32(0.00392156862745098))
    pixels_gpu = pixels.cuda().contiguous()
    out_gpu = torch.zeros(2 * NUM_QUERIES * 5, dtype=torch.float32, device="cuda")  # scores + boxes
    torch.cuda.synchronize()
    h_in, off_in, bytes_in = ipc(pixels_gpu)
    h_out, off_out, bytes_out = ipc(out_gpu)
    t.register("pixels", h_in, bytes_in)
    t.register("out", h_out, bytes_out)
    names = t.region_names()
    check(names == ["out", "pixels"], f"[{t.protocol}] the CUDA status lists both regions: {names}")

    pv = t.m.InferInput("pixel_values", list(pixels.shape), "FP32")
    pv.set_shared_memory("pixels", pixels.numel() * 4, offset=off_in)
    ts = t.m.InferInput("target_sizes", [2, 2], "INT64")
    ts.set_data_from_numpy(np.array([[512, 512], [400, 600]], dtype=np.int64))
    outs = [t.m.InferRequestedOutput(n) for n in ("scores", "labels", "boxes", "num_detections")]
    score_bytes = 2 * NUM_QUERIES * 4
    outs[0].set_shared_memory("out", score_bytes, offset=off_out)
    outs[2].set_shared_memory("out", score_bytes * 4, offset=off_out + score_bytes)
    r = c.infer(model, [pv, ts], outputs=outs, parameters={"threshold": 0.3})
    torch.cuda.synchronize()
    if t.protocol == "http":
        params = r.get_output("scores").get("parameters", {})
        check(params.get("shared_memory_region") == "out" and "data" not in r.get_output("scores"),
              f"[http] scores are reported in region 'out' without data: {params}")
    counts, labels = r.as_numpy("num_detections"), r.as_numpy("labels")
    host = out_gpu.cpu().numpy()
    scores = host[: 2 * NUM_QUERIES].reshape(2, NUM_QUERIES)
    boxes = host[2 * NUM_QUERIES:].reshape(2, NUM_QUERIES, 4)
    max_score = max_box = 0.0
    for i in range(2):
        p = f"th0.3_img{i}_"
        es, el, eb = expected[p + "scores"], expected[p + "labels"], expected[p + "boxes"]
        n = int(counts[i])
        check(n == es.shape[0], f"[{t.protocol}] image {i}: {n} detections (expected {es.shape[0]})")
        check(np.array_equal(labels[i, :n], el), f"[{t.protocol}] image {i}: labels equal the fixture")
        max_score = max(max_score, float(np.abs(scores[i, :n] - es).max(initial=0)))
        max_box = max(max_box, float(np.abs(boxes[i, :n] - eb).max(initial=0)))
    check(max_score <= 1e-4, f"[{t.protocol}] scores read from the CUDA output region: max |diff| {max_score:.3g} <= 1e-4")
    check(max_box <= 1e-2, f"[{t.protocol}] boxes read from the CUDA output region: max |diff| {max_box:.3g} <= 1e-2 px")

    try:
        t.register("pixels", h_in, bytes_in)
        check(False, f"[{t.protocol}] a duplicate name is refused")
    except InferenceServerException as e:
        check(e.status() == t.status_of("ALREADY_EXISTS")
              and e.message() == "shared memory region 'pixels' already in manager",
              f"[{t.protocol}] a duplicate name is ALREADY_EXISTS: {e.status()} {e.message()}")
    c.unregister_cuda_shared_memory()
    check(t.region_names() == [], f"[{t.protocol}] unregister leaves no region")
    # After the unregister: a second open of one handle in the daemon may share its mapping.
    try:
        t.register("huge", h_in, bytes_in * 1000)
        check(False, f"[{t.protocol}] a byte_size beyond the allocation is refused")
        c.unregister_cuda_shared_memory("huge")
    except InferenceServerException as e:
        check(e.status() == t.status_of("INVALID_ARGUMENT"),
              f"[{t.protocol}] beyond the allocation: {e.status()} {e.message()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", help="HOST:PORT of the --protocol's port (gRPC or HTTP)")
    ap.add_argument("--binary")
    ap.add_argument("--model", default="rtdetr_tiny")
    ap.add_argument("--protocol", choices=("grpc", "http", "both"), default="grpc")
    a = ap.parse_args()
    daemon, workdir = None, None
    urls = {}
    if a.server:
        if a.protocol == "both":
            raise SystemExit("--protocol both needs --binary (one --server address is one port)")
        urls[a.protocol] = a.server
    else:
        if not a.binary:
            raise SystemExit("give --server HOST:PORT or --binary PATH")
        workdir = tempfile.mkdtemp(prefix="cuda-shm-")
        daemon, urls["grpc"], urls["http"] = start_daemon(a.binary, workdir)
    protocols = ["grpc", "http"] if a.protocol == "both" else [a.protocol]
    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("PASS " if ok else "FAIL ") + what)
        failures += not ok

    try:
        for protocol in protocols:
            run_checks(Transport(protocol, urls[protocol]), a.model, check)
    finally:
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
            print(f"daemon log: {workdir}/server.log")
    print("cuda_shm_client: " + ("OK" if failures == 0 else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
