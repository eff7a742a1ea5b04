"""Prometheus against the daemon's GET /metrics: `promtool check metrics` (the lint Prometheus
ships) and a real Prometheus server (Debian package `prometheus`) scraping the HTTP admin port,
read back through its HTTP API (/api/v1/targets, /api/v1/query).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from peers_env import DETECTOR, GRPC, HTTP, WORK, free_port, http_get, image

REQUESTS = 'libreyolo_inference_requests_total{model="%s",version="1",code="OK"}' % DETECTOR
_SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_series(series):
    """'name{a="x",b="y"}' -> (name, {a: x, b: y})."""
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$', series)
    return m.group(1), dict(_LABEL.findall(m.group(2) or ""))


def sample(metrics_text, series):
    """The value of `series` (name and exactly these labels, any order) in exposition text, or None."""
    want = parse_series(series)
    for line in metrics_text.splitlines():
        m = _SERIES.match(line)
        if m and (m.group(1), dict(_LABEL.findall(m.group(2) or ""))) == want:
            return float(m.group(3))
    return None


def infer_once():
    inp = grpcclient.InferInput("images", [1], "BYTES")
    inp.set_data_from_numpy(np.array([image("coffee.jpg")], dtype=np.object_))
    grpcclient.InferenceServerClient(url=GRPC).infer(DETECTOR, [inp])


class Promtool(unittest.TestCase):
    def test_check_metrics(self):
        tool = shutil.which("promtool")
        self.assertIsNotNone(tool, "promtool not found: install the Debian package `prometheus`")
        infer_once()  # histograms and per-status counters get their first samples
        status, text = http_get("/metrics")
        self.assertEqual(status, 200)
        families = [l for l in text.splitlines() if l.startswith("# TYPE ")]
        r = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=30)
        print(f"\n  promtool check metrics: exit {r.returncode}, {len(families)} families, "
              f"output {r.stdout + r.stderr!r}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual((r.stdout + r.stderr).strip(), "")
        self.assertIsNotNone(sample(text, REQUESTS), f"no series {REQUESTS} in /metrics")
        # It can fail: a counter without the _total suffix is reported.
        r = subprocess.run([tool, "check", "metrics"], capture_output=True, text=True, timeout=30,
                           input="# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests 1\n")
        self.assertNotEqual(r.returncode, 0)


class PrometheusServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        binary = shutil.which("prometheus")
        if binary is None:
            raise AssertionError("prometheus not found: install the Debian package `prometheus`")
        cls.dir = tempfile.mkdtemp(prefix="prometheus.", dir=WORK)
        cls.port = free_port()
        config = os.path.join(cls.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: libreyolo\n"
                    f"    static_configs:\n      - targets: ['{HTTP}']\n")
        cls.log = open(os.path.join(cls.dir, "prometheus.log"), "w")
        cls.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={cls.dir}/data",
             f"--web.listen-address=127.0.0.1:{cls.port}", "--log.level=warn"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if cls.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{cls.port}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        cls.tearDownClass()
        raise AssertionError(f"prometheus not ready on 127.0.0.1:{cls.port} within 30 s: "
                             + open(os.path.join(cls.dir, "prometheus.log")).read()[-2000:])

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        try:
            cls.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            cls.proc.wait()
        cls.log.close()

    def api(self, path, **query):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read().decode())
        self.assertEqual(body["status"], "success", body)
        return body["data"]

    def wait_for(self, what, fn, seconds=30):
        deadline = time.time() + seconds
        last = None
        while time.time() < deadline:
            last = fn()
            if last[0]:
                return last[1]
            time.sleep(0.25)
        self.fail(f"{what} within {seconds} s; last: {last[1]}")

    def test_scrape(self):
        def target():
            active = self.api("targets")["activeTargets"]
            ok = len(active) == 1 and active[0]["health"] == "up"
            return ok, active

        t = self.wait_for("target health up", target)[0]
        self.assertEqual(t["scrapeUrl"], f"http://{HTTP}/metrics")
        self.assertEqual(t["labels"]["job"], "libreyolo")
        self.assertEqual(t["lastError"], "")
        print(f"\n  prometheus target {t['scrapeUrl']}: health {t['health']}, "
              f"last scrape {t['lastScrapeDuration']:.4f} s")

        # A request after the first scrape: Prometheus must report the counter's new value, the
        # same number the daemon's /metrics shows (no other request runs meanwhile).
        infer_once()
        want = sample(http_get("/metrics")[1], REQUESTS)
        self.assertIsNotNone(want)
        query = REQUESTS

        def value():
            result = self.api("query", query=query)["result"]
            got = float(result[0]["value"][1]) if len(result) == 1 else None
            return got == want, result

        result = self.wait_for(f"{query} == {want}", value)
        print(f"  prometheus query {query} = {result[0]['value'][1]} (daemon /metrics: {want:g})")
        up = self.api("query", query='up{job="libreyolo"}')["result"]
        self.assertEqual([r["value"][1] for r in up], ["1"])
        # A histogram made it through as well.
        hist = self.api("query", query='libreyolo_request_duration_seconds_count{model="%s"}' % DETECTOR)["result"]
        self.assertGreaterEqual(len(hist), 1, hist)
        self.assertGreater(float(hist[0]["value"][1]), 0)


if __name__ == "__main__":
    unittest.main()
