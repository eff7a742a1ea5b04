"""NVIDIA's tritonclient (HTTP, PyPI tritonclient[http]) against libreyolo-server's HTTP port.

KServe v2 REST through Triton's own HTTP client: health, server and model metadata, model
configuration, statistics, repository index, and inference with binary tensor data (Triton's
binary extension, the client's default) and with JSON data, on the example RT-DETR and ViT;
every output equal to what tritonclient.grpc gets from the gRPC port for the same request.
"""
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from safetensors.numpy import load_file
from tritonclient.utils import InferenceServerException

from peers_env import CLASSIFIER, DETECTOR, FIXTURES, GRPC, HTTP, image

EXPECTED = f"{FIXTURES}/models/rtdetr_tiny/expected.safetensors"
IMAGES = ["astronaut.jpg", "coffee.jpg"]
DETECTOR_OUTPUTS = ["scores", "labels", "boxes", "num_detections", "label_names"]


def http():
    return httpclient.InferenceServerClient(url=HTTP)


def grpc():
    return grpcclient.InferenceServerClient(url=GRPC)


class Metadata(unittest.TestCase):
    def test_health(self):
        c = http()
        self.assertIs(c.is_server_live(), True)
        self.assertIs(c.is_server_ready(), True)
        self.assertIs(c.is_model_ready(DETECTOR), True)
        self.assertIs(c.is_model_ready(DETECTOR, "1"), True)
        self.assertIs(c.is_model_ready(CLASSIFIER), True)
        self.assertIs(c.is_model_ready("nope"), False)
        self.assertIs(c.is_model_ready(DETECTOR, "7"), False)

    def test_server_and_model_metadata(self):
        c = http()
        # cuda_shared_memory only in a build with CUDA (server/shm/registry.h), as over gRPC.
        base = ["model_configuration", "statistics", "model_repository", "system_shared_memory"]
        self.assertIn(c.get_server_metadata(), [
            {"name": "libreyolo-server", "version": "0.1.0", "extensions": base},
            {"name": "libreyolo-server", "version": "0.1.0",
             "extensions": base + ["cuda_shared_memory"]}])
        m = c.get_model_metadata(DETECTOR)
        self.assertEqual(m["name"], DETECTOR)
        self.assertEqual(m["versions"], ["1"])
        self.assertEqual(m["platform"], "libreyolo_rt_detr")
        self.assertEqual([(t["name"], t["datatype"], t["shape"]) for t in m["inputs"]], [
            ("images", "BYTES", [-1, 1]),
            ("pixel_values", "FP32", [-1, 3, -1, -1]),
            ("target_sizes", "INT64", [-1, 2])])
        # The same document as the gRPC side's (tritonclient.grpc as_json).
        g = grpc().get_model_metadata(DETECTOR, as_json=True)
        self.assertEqual([o["name"] for o in m["outputs"]], [o["name"] for o in g["outputs"]])
        self.assertEqual([[int(d) for d in o["shape"]] for o in g["outputs"]],
                         [o["shape"] for o in m["outputs"]])
        with self.assertRaises(InferenceServerException) as e:
            c.get_model_metadata("nope")
        self.assertEqual(e.exception.status(), "404")
        self.assertEqual(e.exception.message(), "unknown model 'nope'")

    def test_model_config(self):
        cfg = http().get_model_config(DETECTOR)
        self.assertEqual(cfg["name"], DETECTOR)
        self.assertEqual(cfg["platform"], "libreyolo_rt_detr")
        self.assertEqual(cfg["backend"], "libreyolo")
        self.assertEqual(cfg["max_batch_size"], 8)
        self.assertEqual([(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]], [
            ("images", "TYPE_STRING", [1]),
            ("pixel_values", "TYPE_FP32", [3, -1, -1]),
            ("target_sizes", "TYPE_INT64", [2])])
        self.assertEqual(cfg["dynamic_batching"]["max_queue_delay_microseconds"], 2000)
        self.assertEqual(cfg["dynamic_batching"]["default_queue_policy"]["max_queue_size"], 64)
        self.assertEqual(http().get_model_config(CLASSIFIER)["max_batch_size"], 4)

    def test_statistics_and_repository(self):
        s = http().get_inference_statistics(DETECTOR)["model_stats"]
        self.assertEqual([(m["name"], m["version"]) for m in s], [(DETECTOR, "1")])
        everything = http().get_inference_statistics()["model_stats"]
        self.assertEqual(sorted(m["name"] for m in everything), sorted([DETECTOR, CLASSIFIER]))
        index = http().get_model_repository_index()
        self.assertEqual([(m["name"], m["version"], m["state"]) for m in index],
                         [(DETECTOR, "1", "READY"), (CLASSIFIER, "1", "READY")])
        with self.assertRaises(InferenceServerException) as e:
            http().load_model(DETECTOR)
        self.assertEqual(e.exception.status(), "403")
        self.assertIn("model_control: none", e.exception.message())


class Infer(unittest.TestCase):
    def grpc_images(self, model, outputs, **kwargs):
        inp = grpcclient.InferInput("images", [2], "BYTES")
        inp.set_data_from_numpy(np.array([image(n) for n in IMAGES], dtype=np.object_))
        return grpc().infer(model, [inp], outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                            **kwargs)

    def assert_same(self, h, g, outputs):
        for name in outputs:
            a, b = h.as_numpy(name), g.as_numpy(name)
            self.assertIsNotNone(a, name)
            self.assertEqual(a.shape, b.shape, name)
            if b.dtype == np.object_:
                self.assertEqual([bytes(x) if isinstance(x, bytes) else x.encode() for x in a.ravel()],
                                 [bytes(x) for x in b.ravel()], name)
            else:
                self.assertEqual(a.dtype, b.dtype, name)
                np.testing.assert_array_equal(a, b, err_msg=name)

    def test_binary_images_equal_grpc(self):
        inp = httpclient.InferInput("images", [2], "BYTES")
        inp.set_data_from_numpy(np.array([image(n) for n in IMAGES], dtype=np.object_),
                                binary_data=True)
        outs = [httpclient.InferRequestedOutput(o, binary_data=True) for o in DETECTOR_OUTPUTS]
        h = http().infer(DETECTOR, [inp], outputs=outs, parameters={"threshold": 0.3},
                         request_id="peers-http")
        g = self.grpc_images(DETECTOR, DETECTOR_OUTPUTS, parameters={"threshold": 0.3})
        r = h.get_response()
        self.assertEqual((r["model_name"], r["model_version"], r["id"]), (DETECTOR, "1", "peers-http"))
        self.assertEqual(h.as_numpy("num_detections").shape, (2,))
        self.assertGreater(int(h.as_numpy("num_detections").sum()), 0)
        self.assert_same(h, g, DETECTOR_OUTPUTS)

    def test_json_pixel_values_equal_grpc(self):
        # The fixture's own pixels, sent as JSON numbers (FP32 -> decimal -> FP32 is exact).
        u8 = load_file(EXPECTED)["pixel_u8"][:1].astype(np.float32)
        pixels = (u8 * np.float32(0.00392156862745098)).astype(np.float32)
        sizes = np.array([[512, 512]], dtype=np.int64)
        pv = httpclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv.set_data_from_numpy(pixels, binary_data=False)
        ts = httpclient.InferInput("target_sizes", [1, 2], "INT64")
        ts.set_data_from_numpy(sizes, binary_data=False)
        outs = [httpclient.InferRequestedOutput(o, binary_data=False) for o in DETECTOR_OUTPUTS]
        h = http().infer(DETECTOR, [pv, ts], outputs=outs, parameters={"threshold": 0.3})
        self.assertNotIn("parameters", h.get_response()["outputs"][0])  # JSON data, not binary
        gpv = grpcclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        gpv.set_data_from_numpy(pixels)
        gts = grpcclient.InferInput("target_sizes", [1, 2], "INT64")
        gts.set_data_from_numpy(sizes)
        g = grpc().infer(DETECTOR, [gpv, gts], outputs=[grpcclient.InferRequestedOutput(o) for o in DETECTOR_OUTPUTS],
                         parameters={"threshold": 0.3})
        self.assert_same(h, g, DETECTOR_OUTPUTS)
        # And the transformers reference of tests/fixtures (th0.3, image 0) within parity bounds.
        expected = load_file(EXPECTED)
        n = int(h.as_numpy("num_detections")[0])
        self.assertEqual(n, expected["th0.3_img0_scores"].shape[0])
        np.testing.assert_allclose(h.as_numpy("scores")[0, :n], expected["th0.3_img0_scores"], atol=1e-4)

    def test_classifier_default_outputs_binary(self):
        # No outputs listed: tritonclient asks binary_data_output for all of them.
        inp = httpclient.InferInput("images", [2], "BYTES")
        inp.set_data_from_numpy(np.array([image(n) for n in IMAGES], dtype=np.object_))
        h = http().infer(CLASSIFIER, [inp])
        outputs = [o["name"] for o in h.get_response()["outputs"]]
        self.assertEqual(outputs, ["logits", "probabilities", "scores", "labels", "label_names"])
        g = self.grpc_images(CLASSIFIER, outputs)
        self.assert_same(h, g, outputs)

    def test_errors(self):
        inp = httpclient.InferInput("images", [1], "BYTES")
        inp.set_data_from_numpy(np.array([image("coffee.jpg")], dtype=np.object_))
        with self.assertRaises(InferenceServerException) as e:
            http().infer("nope", [inp])
        self.assertEqual(e.exception.status(), "404")
        self.assertEqual(e.exception.message(), "unknown model 'nope'")
        corrupt = httpclient.InferInput("images", [1], "BYTES")
        corrupt.set_data_from_numpy(np.array([image("coffee.jpg")[:200]], dtype=np.object_))
        with self.assertRaises(InferenceServerException) as e:
            http().infer(DETECTOR, [corrupt])
        self.assertEqual(e.exception.status(), "400")
        self.assertTrue(e.exception.message().startswith("input 'images': image 0: "),
                        e.exception.message())
        self.assertIs(http().is_server_ready(), True)


if __name__ == "__main__":
    unittest.main()
