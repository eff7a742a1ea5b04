"""CUDA shared memory through tritonclient.grpc against a running libreyolo-server on the GPU
machine: the fixture's pixel_values in a torch CUDA tensor, shared with cudaIpcGetMemHandle
(torch's storage._share_cuda_(), the handle tritonclient.utils.cuda_shared_memory would give),
registered with CudaSharedMemoryRegister; `scores` and `boxes` are written by the daemon into a
second CUDA region and read back here from the client's own device memory. The detections are
compared with the transformers fixture (tests/fixtures/models/rtdetr_tiny/expected.safetensors,
the bounds of tests/peers/tritonclient_test.py test_fp32_pixel_values).

Run (GPU machine, repository root), against a daemon serving rtdetr_tiny on cuda:
    python3 tests/gpu/cuda_shm_client.py --server 127.0.0.1:8001 [--model rtdetr_tiny]
or let it start one: python3 tests/gpu/cuda_shm_client.py --binary build-gpu/bin/libreyolo-server
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


def start_daemon(binary, workdir):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    gp = port.getsockname()[1]
    port.close()
    repo = os.path.join(workdir, "repo")
    os.makedirs(os.path.join(repo, "rtdetr_tiny", "1"))
    src = os.path.join(ROOT, "tests/fixtures/models/rtdetr_tiny")
    for f in ("config.json", "model.safetensors", "preprocessor_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(repo, "rtdetr_tiny", "1", f))
    with open(os.path.join(repo, "rtdetr_tiny", "serving.yaml"), "w") as f:
        f.write("device: cuda\nmax_batch_size: 4\n")
    cfg = os.path.join(workdir, "server.yaml")
    with open(cfg, "w") as f:
        f.write(f"server:\n  grpc_address: 127.0.0.1:{gp}\n  http_address: \"off\"\n  drain_seconds: 0\n"
                f"model_repository: {repo}\ndevice: cuda\ntf32: off\nkernels:\n  hub_kernels: off\n")
    log = open(os.path.join(workdir, "server.log"), "w")
    p = subprocess.Popen([binary, "--config", cfg], stdout=log, stderr=subprocess.STDOUT,
                         env=dict(os.environ, LIBREYOLO_HUB_KERNELS="0"))
    c = grpcclient.InferenceServerClient(url=f"127.0.0.1:{gp}")
    for _ in range(600):
        try:
            if c.is_server_ready():
                return p, f"127.0.0.1:{gp}"
        except InferenceServerException:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.5)
    raise SystemExit(f"the daemon did not become ready; see {workdir}/server.log")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--binary")
    ap.add_argument("--model", default="rtdetr_tiny")
    a = ap.parse_args()
    daemon, workdir = None, None
    if not a.server:
        if not a.binary:
            raise SystemExit("give --server HOST:PORT or --binary PATH")
        workdir = tempfile.mkdtemp(prefix="cuda-shm-")
        daemon, a.server = start_daemon(a.binary, workdir)
    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("PASS " if ok else "FAIL ") + what)
        failures += not ok

    try:
        c = grpcclient.InferenceServerClient(url=a.server)
        c.unregister_cuda_shared_memory()
        expected = load_file(EXPECTED)
        pixels = torch.from_numpy(expected["pixel_u8"].astype(np.float32) * np.float32(0.00392156862745098))
        pixels_gpu = pixels.cuda().contiguous()
        out_gpu = torch.zeros(2 * NUM_QUERIES * 5, dtype=torch.float32, device="cuda")  # scores + boxes
        torch.cuda.synchronize()
        h_in, off_in, bytes_in = ipc(pixels_gpu)
        h_out, off_out, bytes_out = ipc(out_gpu)
        c.register_cuda_shared_memory("pixels", h_in, 0, bytes_in)
        c.register_cuda_shared_memory("out", h_out, 0, bytes_out)
        status = c.get_cuda_shared_memory_status()
        check(sorted(status.regions) == ["out", "pixels"], f"CudaSharedMemoryStatus lists both regions: {sorted(status.regions)}")

        pv = grpcclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv.set_shared_memory("pixels", pixels.numel() * 4, offset=off_in)
        ts = grpcclient.InferInput("target_sizes", [2, 2], "INT64")
        ts.set_data_from_numpy(np.array([[512, 512], [400, 600]], dtype=np.int64))
        outs = [grpcclient.InferRequestedOutput(n) for n in ("scores", "labels", "boxes", "num_detections")]
        score_bytes = 2 * NUM_QUERIES * 4
        outs[0].set_shared_memory("out", score_bytes, offset=off_out)
        outs[2].set_shared_memory("out", score_bytes * 4, offset=off_out + score_bytes)
        r = c.infer(a.model, [pv, ts], outputs=outs, parameters={"threshold": 0.3})
        torch.cuda.synchronize()
        counts, labels = r.as_numpy("num_detections"), r.as_numpy("labels")
        host = out_gpu.cpu().numpy()
        scores = host[: 2 * NUM_QUERIES].reshape(2, NUM_QUERIES)
        boxes = host[2 * NUM_QUERIES:].reshape(2, NUM_QUERIES, 4)
        max_score = max_box = 0.0
        for i in range(2):
            p = f"th0.3_img{i}_"
            es, el, eb = expected[p + "scores"], expected[p + "labels"], expected[p + "boxes"]
            n = int(counts[i])
            check(n == es.shape[0], f"image {i}: {n} detections (expected {es.shape[0]})")
            check(np.array_equal(labels[i, :n], el), f"image {i}: labels equal the fixture")
            max_score = max(max_score, float(np.abs(scores[i, :n] - es).max(initial=0)))
            max_box = max(max_box, float(np.abs(boxes[i, :n] - eb).max(initial=0)))
        check(max_score <= 1e-4, f"scores read from the CUDA output region: max |diff| {max_score:.3g} <= 1e-4")
        check(max_box <= 1e-2, f"boxes read from the CUDA output region: max |diff| {max_box:.3g} <= 1e-2 px")

        try:
            c.register_cuda_shared_memory("pixels", h_in, 0, bytes_in)
            check(False, "a duplicate name is refused")
        except InferenceServerException as e:
            check(e.status() == "StatusCode.ALREADY_EXISTS"
                  and e.message() == "shared memory region 'pixels' already in manager",
                  f"a duplicate name is ALREADY_EXISTS: {e.status()} {e.message()}")
        c.unregister_cuda_shared_memory()
        check(len(c.get_cuda_shared_memory_status().regions) == 0, "unregister leaves no region")
        # After the unregister: a second open of one handle in the daemon may share its mapping.
        try:
            c.register_cuda_shared_memory("huge", h_in, 0, bytes_in * 1000)
            check(False, "a byte_size beyond the allocation is refused")
            c.unregister_cuda_shared_memory("huge")
        except InferenceServerException as e:
            check(e.status() == "StatusCode.INVALID_ARGUMENT", f"beyond the allocation: {e.status()} {e.message()}")
    finally:
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
            print(f"daemon log: {workdir}/server.log")
    print("cuda_shm_client: " + ("OK" if failures == 0 else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
