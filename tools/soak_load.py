#!/usr/bin/env python3
"""Mixed closed-loop load for libreyolo-server over TLS (scripts/soak.sh SOAK_MODE=mixed,
scripts/chaos.sh).

Kinds (the concurrency is split evenly among those asked, the remainder to the first ones):
  grpc_jpeg    gRPC ModelInfer, `images` BYTES (the JPEG file), tritonclient.grpc
  rest_json    POST /v2/models/M/infer, `pixel_values` FP32 [1,3,S,S] as JSON data (--json-size)
  rest_binary  POST /v2/models/M/infer, `pixel_values` FP32 [1,3,640,640] in the binary tensor
               extension (Inference-Header-Content-Length), outputs asked binary
  shm          gRPC ModelInfer, `pixel_values` FP32 [1,3,640,640] in a system shared-memory
               region (one per worker, created and registered at start, unregistered and
               unlinked at the end)
Each worker keeps one connection (gRPC channel, HTTPS keep-alive) and sends one request after the
other until --duration ends or SIGTERM/SIGINT. Every --step seconds one row per kind is appended
to --csv: t_s,kind,ok,errors,requests_per_s,p50_ms,p99_ms. At the end a JSON summary (per kind:
ok, errors by message, retried requests) goes to --json and stdout.

--retry (chaos): a request that fails because the daemon is gone (gRPC UNAVAILABLE, HTTP
connection refused/reset/closed) or that names a shared-memory region the daemon no longer knows
is sent again (every 0.25 s, re-registering the region first) until it succeeds or --retry-for
seconds pass; the failures seen are counted under `retried_errors`, not `errors`.
Exit status: 0 when no kind had an error, 1 otherwise, 2 bad arguments.
"""
import argparse
import collections
import http.client
import json
import os
import signal
import ssl
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

KINDS = ("grpc_jpeg", "rest_json", "rest_binary", "shm")
stop = threading.Event()


class Stats:
    def __init__(self, kinds):
        self.lock = threading.Lock()
        self.ok = {k: 0 for k in kinds}
        self.errors = {k: collections.Counter() for k in kinds}
        self.retried = {k: collections.Counter() for k in kinds}
        self.retried_requests = {k: 0 for k in kinds}
        self.window = {k: [] for k in kinds}  # latencies (s) of this step
        self.window_err = {k: 0 for k in kinds}

    def done(self, kind, seconds):
        with self.lock:
            self.ok[kind] += 1
            self.window[kind].append(seconds)

    def error(self, kind, message):
        with self.lock:
            self.errors[kind][message] += 1
            self.window_err[kind] += 1

    def retry(self, kind, message):
        with self.lock:
            self.retried[kind][message] += 1

    def take(self, kind):
        with self.lock:
            lat, self.window[kind] = self.window[kind], []
            err, self.window_err[kind] = self.window_err[kind], 0
        return sorted(lat), err


class Gone(Exception):
    """The daemon is not there (retryable under --retry)."""


def pct(v, q):
    return v[min(len(v) - 1, int(q * len(v)))] * 1000 if v else 0.0


def ssl_context(a):
    ctx = ssl.create_default_context(cafile=a.ca)
    if a.cert:
        ctx.load_cert_chain(a.cert, a.key)
    return ctx


class Rest:
    def __init__(self, a):
        self.a = a
        self.host, port = a.http.rsplit(":", 1)
        self.port = int(port)
        self.ctx = ssl_context(a) if a.ca else None
        self.conn = None

    def post(self, path, body, headers):
        for attempt in (0, 1):  # a kept-alive connection the daemon closed: once more on a new one
            if self.conn is None:
                if self.ctx:
                    self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx,
                                                            timeout=self.a.timeout)
                else:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.a.timeout)
            fresh = attempt == 1
            try:
                self.conn.request("POST", path, body=body, headers=headers)
                r = self.conn.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return r, data
            except (ConnectionRefusedError, FileNotFoundError) as e:
                self.close()
                raise Gone(f"HTTP {type(e).__name__}") from e
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                    http.client.CannotSendRequest, ssl.SSLEOFError) as e:
                self.close()
                if fresh:
                    raise Gone(f"HTTP {type(e).__name__}") from e
            except Exception:
                self.close()
                raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def grpc_client(a):
    if a.ca:
        return grpcclient.InferenceServerClient(a.grpc, ssl=True, root_certificates=a.ca,
                                                private_key=a.key, certificate_chain=a.cert)
    return grpcclient.InferenceServerClient(a.grpc)


def pixels(size):
    rng = np.random.default_rng(size)
    return rng.random((1, 3, size, size), dtype=np.float32)


def worker(kind, index, a, stats, payload):
    headers = {}
    if a.header:
        k, v = a.header.split("=", 1)
        headers[k] = v
    client = rest = region = None
    region_name = f"soak_{os.getpid()}_{index}"
    region_key = f"/libreyolo_soak_{os.getpid()}_{index}"

    def register():
        try:
            client.unregister_system_shared_memory(region_name, headers=headers)
        except InferenceServerException:
            pass
        client.register_system_shared_memory(region_name, region_key, payload["pv640"].nbytes,
                                              headers=headers)

    if kind in ("grpc_jpeg", "shm"):
        client = grpc_client(a)
    else:
        rest = Rest(a)
    if kind == "shm":
        region = shm.create_shared_memory_region(region_name, region_key, payload["pv640"].nbytes)
        shm.set_shared_memory_region(region, [payload["pv640"]])

    def once():
        if kind == "grpc_jpeg":
            inp = grpcclient.InferInput("images", [1], "BYTES")
            inp.set_data_from_numpy(payload["jpeg"])
            r = client.infer(a.model, [inp], client_timeout=a.timeout, headers=headers)
            if r.as_numpy("scores") is None:
                raise RuntimeError("no 'scores' output")
        elif kind == "shm":
            inp = grpcclient.InferInput("pixel_values", [1, 3, 640, 640], "FP32")
            inp.set_shared_memory(region_name, payload["pv640"].nbytes)
            r = client.infer(a.model, [inp], client_timeout=a.timeout, headers=headers)
            if r.as_numpy("scores") is None:
                raise RuntimeError("no 'scores' output")
        else:
            h = dict(headers)
            if kind == "rest_json":
                body = payload["json"]
                h["Content-Type"] = "application/json"
            else:
                body = payload["binary"]
                h["Content-Type"] = "application/octet-stream"
                h["Inference-Header-Content-Length"] = str(payload["binary_header"])
            r, data = rest.post(f"/v2/models/{a.model}/infer", body, h)
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data[:160].decode(errors='replace')}")
            n = int(r.getheader("Inference-Header-Content-Length") or len(data))
            head = json.loads(data[:n])
            if not any(o.get("name") == "scores" for o in head.get("outputs", [])):
                raise RuntimeError("no 'scores' output")

    def classify(e):
        """(message, retryable)"""
        if isinstance(e, Gone):
            return str(e), True
        if isinstance(e, InferenceServerException):
            status = str(e.status())
            msg = f"{status}: {(e.message() or '')[:160]}"
            if "UNAVAILABLE" in status:
                return msg, True
            if kind == "shm" and ("NOT_FOUND" in status or "not registered" in msg
                                  or "unknown" in msg.lower()):
                return msg, True
            return msg, False
        return f"{type(e).__name__}: {str(e)[:160]}", False

    try:
        if kind == "shm":
            deadline = time.monotonic() + (a.retry_for if a.retry else 0)
            while True:
                try:
                    register()
                    break
                except InferenceServerException as e:
                    if time.monotonic() > deadline or stop.is_set():
                        stats.error(kind, f"register: {e.status()}: {e.message()}")
                        return
                    time.sleep(0.25)
        while not stop.is_set():
            t = time.monotonic()
            first_failure = True
            while True:
                try:
                    once()
                    stats.done(kind, time.monotonic() - t)
                    break
                except Exception as e:  # noqa: BLE001 - every failure is counted by its message
                    msg, retryable = classify(e)
                    if not (a.retry and retryable) or time.monotonic() - t > a.retry_for:
                        stats.error(kind, msg)
                        if rest:
                            rest.close()
                        time.sleep(0.05)
                        break
                    stats.retry(kind, msg)
                    if first_failure:
                        with stats.lock:
                            stats.retried_requests[kind] += 1
                        first_failure = False
                    time.sleep(0.25)
                    if kind == "shm":
                        try:
                            register()
                        except InferenceServerException:
                            pass
    finally:
        if kind == "shm":
            try:
                client.unregister_system_shared_memory(region_name, headers=headers)
            except InferenceServerException:
                pass
            shm.destroy_shared_memory_region(region)
        if client is not None:
            client.close()
        if rest is not None:
            rest.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grpc", required=True, help="HOST:PORT of the gRPC port")
    p.add_argument("--http", help="HOST:PORT of the HTTP port (rest_* kinds)")
    p.add_argument("--model", default="rtdetr_tiny")
    p.add_argument("--image", required=True, help="JPEG/PNG file for grpc_jpeg")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--step", type=float, default=60)
    p.add_argument("--timeout", type=float, default=120, help="seconds per request")
    p.add_argument("--json-size", type=int, default=320, help="S of rest_json's [1,3,S,S]")
    p.add_argument("--ca", help="CA of the daemon's certificate (TLS on both ports)")
    p.add_argument("--cert", help="client certificate (mutual TLS)")
    p.add_argument("--key", help="client key (mutual TLS)")
    p.add_argument("--header", help="KEY=VALUE sent with every call")
    p.add_argument("--retry", action="store_true")
    p.add_argument("--retry-for", type=float, default=120)
    p.add_argument("--csv", help="per-step rows are appended here")
    p.add_argument("--json", help="summary")
    a = p.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds) or a.concurrency < len(kinds):
        p.error(f"--kinds from {','.join(KINDS)}, at most --concurrency of them")
    if any(k.startswith("rest") for k in kinds) and not a.http:
        p.error("rest_* kinds need --http")

    payload = {"jpeg": np.array([open(a.image, "rb").read()], dtype=np.object_)}
    pv = pixels(a.json_size)
    payload["json"] = json.dumps({"inputs": [{
        "name": "pixel_values", "datatype": "FP32", "shape": list(pv.shape),
        "data": [round(float(x), 4) for x in pv.ravel()]}]}).encode()
    payload["pv640"] = pixels(640)
    head = json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [1, 3, 640, 640],
                                   "parameters": {"binary_data_size": payload["pv640"].nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    payload["binary_header"] = len(head)
    payload["binary"] = head + payload["pv640"].tobytes()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    stats = Stats(kinds)
    threads = []
    for i in range(a.concurrency):
        kind = kinds[i % len(kinds)]
        t = threading.Thread(target=worker, args=(kind, i, a, stats, payload), daemon=True)
        t.start()
        threads.append(t)
    t0 = time.monotonic()
    last = t0
    csv = open(a.csv, "a") if a.csv else None
    if csv and csv.tell() == 0:
        csv.write("t_s,kind,ok,errors,requests_per_s,p50_ms,p99_ms\n")
    end = t0 + a.duration
    while not stop.is_set():
        now = time.monotonic()
        if now >= end:
            break
        stop.wait(min(a.step - (now - last), end - now))
        now = time.monotonic()
        if now - last >= a.step - 0.01 or now >= end or stop.is_set():
            span = max(now - last, 1e-3)
            for k in kinds:
                lat, err = stats.take(k)
                row = f"{now - t0:.0f},{k},{len(lat)},{err},{len(lat) / span:.2f},{pct(lat, .5):.0f},{pct(lat, .99):.0f}"
                if csv:
                    csv.write(row + "\n")
                    csv.flush()
                print(row, flush=True)
            last = now
    stop.set()
    for t in threads:
        t.join(a.timeout + 10)
    # The requests in flight when the load stopped: one more row per kind (t_s at their end).
    now = time.monotonic()
    for k in kinds:
        lat, err = stats.take(k)
        if lat or err:
            row = f"{now - t0:.0f},{k},{len(lat)},{err},{len(lat) / max(now - last, 1e-3):.2f},{pct(lat, .5):.0f},{pct(lat, .99):.0f}"
            if csv:
                csv.write(row + "\n")
                csv.flush()
            print(row, flush=True)
    summary = {"seconds": round(time.monotonic() - t0, 1), "concurrency": a.concurrency, "kinds": {
        k: {"workers": sum(1 for i in range(a.concurrency) if kinds[i % len(kinds)] == k),
            "ok": stats.ok[k], "errors": sum(stats.errors[k].values()),
            "errors_by_message": dict(stats.errors[k]),
            "retried_requests": stats.retried_requests[k],
            "retried_errors": dict(stats.retried[k])} for k in kinds}}
    text = json.dumps(summary, indent=1)
    if a.json:
        open(a.json, "w").write(text + "\n")
    print(text)
    return 1 if any(v["errors"] for v in summary["kinds"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
