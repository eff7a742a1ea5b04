"""Where the daemon of scripts/test.d/25-peers.sh listens, and the fixtures.

The script starts libreyolo-server on free loopback ports with a temporary repository holding
rtdetr_tiny (max_batch_size 8, max_queue_delay_microseconds 2000, max_queue_size 64, threshold 0.5)
and vit_tiny (max_batch_size 4), then exports these variables and runs tests/peers/*_test.py.
"""
import os
import socket
import urllib.request

_missing = [v for v in ("LIBREYOLO_PEERS_GRPC", "LIBREYOLO_PEERS_HTTP", "LIBREYOLO_PEERS_WORK")
            if v not in os.environ]
if _missing:
    raise RuntimeError(f"{_missing} not set: run these tests through scripts/test.d/25-peers.sh BUILD_DIR")

GRPC = os.environ["LIBREYOLO_PEERS_GRPC"]  # 127.0.0.1:PORT, inference.GRPCInferenceService + health
HTTP = os.environ["LIBREYOLO_PEERS_HTTP"]  # 127.0.0.1:PORT, the HTTP port (KServe v2 REST, /metrics)
WORK = os.environ["LIBREYOLO_PEERS_WORK"]  # temporary folder, removed by the script
ROOT = os.environ.get("LIBREYOLO_SOURCE_DIR",
                      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
DETECTOR = "rtdetr_tiny"
CLASSIFIER = "vit_tiny"


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def image(name):
    """An encoded fixture photograph (tests/fixtures/images/NAME)."""
    return read_bytes(os.path.join(FIXTURES, "images", name))


def http_get(path, timeout=10):
    """GET http://HTTP/path -> (status, body text)."""
    with urllib.request.urlopen(f"http://{HTTP}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
