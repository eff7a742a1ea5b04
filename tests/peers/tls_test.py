"""TLS, mutual TLS and restricted APIs against clients we did not write: tritonclient (gRPC and HTTP
with their ssl options), grpcio's health client over a secure channel, and curl.

Starts its own daemon (server.tls with a client CA, model-repository restricted to a header) on
free loopback ports, with a test CA, a server certificate for 127.0.0.1/localhost and a client
certificate made here by the openssl command, plus a client certificate of another CA.
"""
import json
import os
import subprocess
import tempfile
import time
import unittest

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from peers_env import DETECTOR, WORK, free_port, read_bytes

BUILD = os.environ.get("LIBREYOLO_PEERS_BUILD", "build")


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
            "-subj", f"/CN={name}")


def make_leaf(d, ca, leaf, ext):
    with open(os.path.join(d, f"{leaf}.ext"), "w") as f:
        f.write(ext + "\n")
    openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={leaf}")
    openssl(d, "x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{leaf}.crt", "-days", "2", "-extfile", f"{leaf}.ext")


class Tls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tempfile.mkdtemp(dir=WORK, prefix="tls-")
        d = cls.d
        make_ca(d, "ca")
        make_leaf(d, "ca", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1")
        make_leaf(d, "ca", "client", "extendedKeyUsage=clientAuth")
        make_ca(d, "rogue")
        make_leaf(d, "rogue", "intruder", "extendedKeyUsage=clientAuth")
        cls.grpc_port, cls.http_port = free_port(), free_port()
        while cls.http_port == cls.grpc_port:
            cls.http_port = free_port()
        config = os.path.join(d, "server.yaml")
        with open(config, "w") as f:
            f.write(f"""server:
  grpc_address: 127.0.0.1:{cls.grpc_port}
  http_address: 127.0.0.1:{cls.http_port}
  drain_seconds: 0
  preprocess_threads: 2
  log_level: warn
  tls:
    cert_file: server.crt
    key_file: server.key
    client_ca_file: ca.crt
  restricted_apis:
    model-repository: {{header: admin-key, value_env: LIBREYOLO_PEERS_ADMIN_KEY}}
model_repository: {WORK}/repo
device: cpu
kernels:
  hub_kernels: off
""")
        env = dict(os.environ, LIBREYOLO_HUB_KERNELS="0", LIBREYOLO_PEERS_ADMIN_KEY="s3cret")
        cls.log = open(os.path.join(d, "server.log"), "w")
        cls.daemon = subprocess.Popen([os.path.join(BUILD, "bin", "libreyolo-server"), "--config",
                                       config], stdout=cls.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(240):
            if cls.daemon.poll() is not None:
                break
            # Ready, not only answering: models load after the ports open (the TLS ports answer
            # {"ready": false} meanwhile, with curl exiting 0).
            r = cls.curl("/v2/health/ready", client=True)
            if r.returncode == 0 and r.stdout.strip() == '{"ready":true}':
                return
            time.sleep(0.25)
        cls.tearDownClass()
        raise RuntimeError("the TLS daemon did not become ready: " +
                           read_bytes(os.path.join(d, "server.log")).decode()[-2000:])

    @classmethod
    def tearDownClass(cls):
        if cls.daemon.poll() is None:
            cls.daemon.terminate()
            cls.daemon.wait(timeout=30)
        cls.log.close()

    @classmethod
    def curl(cls, path, client=True, extra=()):
        d = cls.d
        args = ["curl", "-sS", "--max-time", "5", "--cacert", f"{d}/ca.crt", *extra]
        if client:
            args += ["--cert", f"{d}/client.crt", "--key", f"{d}/client.key"]
        args.append(f"https://127.0.0.1:{cls.http_port}{path}")
        return subprocess.run(args, capture_output=True, text=True)

    def grpc_client(self, leaf="client"):
        d = self.d
        return grpcclient.InferenceServerClient(
            f"127.0.0.1:{self.grpc_port}", ssl=True, root_certificates=f"{d}/ca.crt",
            private_key=f"{d}/{leaf}.key", certificate_chain=f"{d}/{leaf}.crt")

    def test_tritonclient_grpc_over_mutual_tls(self):
        c = self.grpc_client()
        self.assertTrue(c.is_server_live())
        self.assertTrue(c.is_model_ready(DETECTOR))
        self.assertEqual(c.get_model_metadata(DETECTOR).name, DETECTOR)
        with self.assertRaises(InferenceServerException):
            self.grpc_client("intruder").is_server_live()

    def test_tritonclient_http_over_mutual_tls(self):
        d = self.d
        c = httpclient.InferenceServerClient(
            f"127.0.0.1:{self.http_port}", ssl=True,
            ssl_options={"ca_certs": f"{d}/ca.crt", "certfile": f"{d}/client.crt",
                         "keyfile": f"{d}/client.key"})
        self.assertTrue(c.is_server_live())
        self.assertEqual(c.get_model_metadata(DETECTOR)["name"], DETECTOR)

    def test_grpc_health_over_tls(self):
        d = self.d
        creds = grpc.ssl_channel_credentials(
            root_certificates=read_bytes(f"{d}/ca.crt"),
            private_key=read_bytes(f"{d}/client.key"),
            certificate_chain=read_bytes(f"{d}/client.crt"))
        with grpc.secure_channel(f"127.0.0.1:{self.grpc_port}", creds) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
            self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)

    def test_curl(self):
        r = self.curl("/v2/health/ready")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), {"ready": True})
        # No client certificate, or one another CA signed: refused at the handshake.
        self.assertNotEqual(self.curl("/v2/health/ready", client=False).returncode, 0)
        d = self.d
        r = subprocess.run(["curl", "-sS", "--max-time", "5", "--cacert", f"{d}/ca.crt", "--cert",
                            f"{d}/intruder.crt", "--key", f"{d}/intruder.key",
                            f"https://127.0.0.1:{self.http_port}/v2/health/ready"],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)

    def test_restricted_model_repository(self):
        c = self.grpc_client()
        with self.assertRaises(InferenceServerException) as e:
            c.get_model_repository_index()
        self.assertIn("This API is restricted, expecting header 'admin-key'", str(e.exception))
        index = c.get_model_repository_index(headers={"admin-key": "s3cret"})
        self.assertIn(DETECTOR, [m.name for m in index.models])
        r = self.curl("/v2/repository/index", extra=("-X", "POST", "-w", "%{http_code}"))
        self.assertTrue(r.stdout.endswith("403"), r.stdout)
        r = self.curl("/v2/repository/index",
                      extra=("-X", "POST", "-H", "admin-key: s3cret", "-w", "%{http_code}"))
        self.assertTrue(r.stdout.endswith("200"), r.stdout)


if __name__ == "__main__":
    unittest.main()
