"""gRPC's own health-checking client (PyPI grpcio-health-checking) against libreyolo-server:
Check and Watch of grpc.health.v1.Health for "", "liveness", "readiness" and an unknown service.
"""
import unittest

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from peers_env import GRPC

SERVING = health_pb2.HealthCheckResponse.SERVING


class Health(unittest.TestCase):
    def setUp(self):
        self.channel = grpc.insecure_channel(GRPC)
        self.stub = health_pb2_grpc.HealthStub(self.channel)

    def tearDown(self):
        self.channel.close()

    def test_check_serving(self):
        for service in ("", "liveness", "readiness"):
            r = self.stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            self.assertEqual(r.status, SERVING, f"service {service!r}: "
                             f"{health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}")

    def test_check_unknown_service(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.stub.Check(health_pb2.HealthCheckRequest(service="no-such-service"), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_watch(self):
        # Watch streams the current status at once, then every change; the daemon stays ready
        # here, so one message each and the call ends by its deadline.
        for service in ("", "liveness", "readiness"):
            stream = self.stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=3)
            first = next(stream)
            self.assertEqual(first.status, SERVING, f"Watch {service!r}")
            stream.cancel()
        # gRPC's health service answers Watch of an unknown service with SERVICE_UNKNOWN (not an
        # error: the service may appear later).
        stream = self.stub.Watch(health_pb2.HealthCheckRequest(service="no-such-service"), timeout=3)
        self.assertEqual(next(stream).status, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        stream.cancel()


if __name__ == "__main__":
    unittest.main()
