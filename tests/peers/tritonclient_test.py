"""NVIDIA's tritonclient (gRPC, PyPI tritonclient[grpc]) against libreyolo-server.

Every RPC the daemon serves, read through Triton's own generated protobuf classes (so any field
number or type that differs from Triton's grpc_service.proto / model_config.proto shows up here),
and ModelInfer with BYTES images and raw FP32 pixel_values compared with the transformers
reference detections of tests/fixtures/models/rtdetr_tiny/expected.safetensors (the same
expectations and bounds as tests/integration/server_grpc_test.cpp DetectionsMatchTheFixture).
"""
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
from safetensors.numpy import load_file
from tritonclient.utils import InferenceServerException

from peers_env import CLASSIFIER, DETECTOR, FIXTURES, GRPC, image

EXPECTED = f"{FIXTURES}/models/rtdetr_tiny/expected.safetensors"
IMAGES = ["astronaut.jpg", "coffee.jpg"]  # img0, img1 of expected.safetensors (meta.json)
NUM_QUERIES, NUM_LABELS = 30, 10          # tests/fixtures/models/rtdetr_tiny/config.json


def client():
    return grpcclient.InferenceServerClient(url=GRPC)


def tensors(metadata_list):
    return [(t.name, t.datatype, list(t.shape)) for t in metadata_list]


def config_tensors(config_list):
    from tritonclient.grpc import model_config_pb2 as mc
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config_list]


class ServerRpcs(unittest.TestCase):
    def test_live_ready_metadata(self):
        c = client()
        self.assertIs(c.is_server_live(), True)
        self.assertIs(c.is_server_ready(), True)
        m = c.get_server_metadata()
        self.assertEqual(m.name, "libreyolo-server")
        self.assertEqual(m.version, "0.1.0")
        # cuda_shared_memory only in a build with CUDA (server/shm/registry.h).
        self.assertIn(list(m.extensions), [
            ["model_configuration", "statistics", "model_repository", "system_shared_memory"],
            ["model_configuration", "statistics", "model_repository", "system_shared_memory",
             "cuda_shared_memory"]])
        j = c.get_server_metadata(as_json=True)
        self.assertEqual(j["name"], "libreyolo-server")

    def test_model_ready(self):
        c = client()
        self.assertIs(c.is_model_ready(DETECTOR), True)
        self.assertIs(c.is_model_ready(DETECTOR, "1"), True)
        self.assertIs(c.is_model_ready(CLASSIFIER), True)
        self.assertIs(c.is_model_ready("nope"), False)
        self.assertIs(c.is_model_ready(DETECTOR, "7"), False)

    def test_model_metadata_detector(self):
        m = client().get_model_metadata(DETECTOR)
        self.assertEqual(m.name, DETECTOR)
        self.assertEqual(list(m.versions), ["1"])
        self.assertEqual(m.platform, "libreyolo_rt_detr")
        # images is [-1, 1], not [-1]: Triton clients (perf_analyzer) take the shape of one batch
        # element from ModelMetadata without the batch dimension and cannot send a scalar ([]).
        self.assertEqual(tensors(m.inputs), [
            ("images", "BYTES", [-1, 1]),
            ("pixel_values", "FP32", [-1, 3, -1, -1]),
            ("target_sizes", "INT64", [-1, 2])])
        self.assertEqual(tensors(m.outputs), [
            ("scores", "FP32", [-1, -1]),
            ("labels", "INT64", [-1, -1]),
            ("boxes", "FP32", [-1, -1, 4]),
            ("num_detections", "INT32", [-1]),
            ("label_names", "BYTES", [-1, -1]),
            ("logits", "FP32", [-1, NUM_QUERIES, NUM_LABELS]),
            ("pred_boxes", "FP32", [-1, NUM_QUERIES, 4])])
        j = client().get_model_metadata(DETECTOR, as_json=True)
        self.assertEqual(j["platform"], "libreyolo_rt_detr")

    def test_model_metadata_errors(self):
        with self.assertRaises(InferenceServerException) as e:
            client().get_model_metadata("nope")
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        self.assertEqual(e.exception.message(), "unknown model 'nope'")
        with self.assertRaises(InferenceServerException) as e:
            client().get_model_metadata(DETECTOR, "7")
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        self.assertIn("has no version '7'", e.exception.message())

    def test_model_config_detector(self):
        r = client().get_model_config(DETECTOR)
        cfg = r.config
        self.assertEqual(cfg.name, DETECTOR)
        self.assertEqual(cfg.platform, "libreyolo_rt_detr")
        self.assertEqual(cfg.backend, "libreyolo")
        self.assertEqual(cfg.max_batch_size, 8)
        # Triton's convention: dims without the batch dimension.
        self.assertEqual(config_tensors(cfg.input), [
            ("images", "TYPE_STRING", [1]),
            ("pixel_values", "TYPE_FP32", [3, -1, -1]),
            ("target_sizes", "TYPE_INT64", [2])])
        self.assertEqual([t.optional for t in cfg.input], [True, True, True])
        self.assertEqual(config_tensors(cfg.output), [
            ("scores", "TYPE_FP32", [-1]),
            ("labels", "TYPE_INT64", [-1]),
            ("boxes", "TYPE_FP32", [-1, 4]),
            ("num_detections", "TYPE_INT32", [1]),
            ("label_names", "TYPE_STRING", [-1]),
            ("logits", "TYPE_FP32", [NUM_QUERIES, NUM_LABELS]),
            ("pred_boxes", "TYPE_FP32", [NUM_QUERIES, 4])])
        self.assertEqual(cfg.WhichOneof("scheduling_choice"), "dynamic_batching")
        self.assertEqual(cfg.dynamic_batching.max_queue_delay_microseconds, 2000)
        self.assertEqual(cfg.dynamic_batching.default_queue_policy.max_queue_size, 64)
        j = client().get_model_config(DETECTOR, as_json=True)
        self.assertEqual(j["config"]["max_batch_size"], 8)

    def test_model_config_classifier(self):
        cfg = client().get_model_config(CLASSIFIER).config
        self.assertEqual(cfg.name, CLASSIFIER)
        self.assertEqual(cfg.max_batch_size, 4)
        self.assertEqual([t.name for t in cfg.input], ["images", "pixel_values"])

    def test_repository_index(self):
        r = client().get_model_repository_index()
        self.assertEqual([(m.name, m.version, m.state, m.reason) for m in r.models], [
            (DETECTOR, "1", "READY", ""), (CLASSIFIER, "1", "READY", "")])

    def test_repository_load_unload_refused(self):
        for call in (client().load_model, client().unload_model):
            with self.assertRaises(InferenceServerException) as e:
                call(DETECTOR)
            self.assertEqual(e.exception.status(), "StatusCode.PERMISSION_DENIED")
            self.assertIn("model_control: none", e.exception.message())
        self.assertIs(client().is_model_ready(DETECTOR), True)


class Infer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.expected = load_file(EXPECTED)

    def check(self, result, score_tol, box_tol, what):
        counts = result.as_numpy("num_detections")
        scores = result.as_numpy("scores")
        labels = result.as_numpy("labels")
        boxes = result.as_numpy("boxes")
        names = result.as_numpy("label_names")
        response = result.get_response()
        self.assertEqual(response.model_name, DETECTOR)
        self.assertEqual(response.model_version, "1")
        self.assertEqual(counts.dtype, np.int32)
        self.assertEqual(scores.dtype, np.float32)
        self.assertEqual(labels.dtype, np.int64)
        self.assertEqual(boxes.dtype, np.float32)
        self.assertEqual(counts.shape, (2,))
        k = scores.shape[1]
        self.assertEqual(labels.shape, (2, k))
        self.assertEqual(boxes.shape, (2, k, 4))
        self.assertEqual(names.shape, (2, k))
        max_score = max_box = 0.0
        for i in range(2):
            p = f"th0.3_img{i}_"
            es, el, eb = self.expected[p + "scores"], self.expected[p + "labels"], self.expected[p + "boxes"]
            self.assertEqual(int(counts[i]), es.shape[0], f"{what} image {i}")
            n = int(counts[i])
            max_score = max(max_score, float(np.abs(scores[i, :n] - es).max(initial=0)))
            max_box = max(max_box, float(np.abs(boxes[i, :n] - eb).max(initial=0)))
            np.testing.assert_array_equal(labels[i, :n], el, err_msg=f"{what} image {i} labels")
            self.assertEqual([bytes(x).decode() for x in names[i, :n]],
                             [f"LABEL_{int(l)}" for l in el], f"{what} image {i} label_names")
        print(f"\n  {what}: max |score - expected| = {max_score:.3g}, "
              f"max |box - expected| = {max_box:.3g} px, {counts.tolist()} detections")
        self.assertLessEqual(max_score, score_tol, what)
        self.assertLessEqual(max_box, box_tol, what)

    def test_bytes_images(self):
        data = np.array([image(n) for n in IMAGES], dtype=np.object_)
        inp = grpcclient.InferInput("images", [2], "BYTES")
        inp.set_data_from_numpy(data)
        r = client().infer(DETECTOR, [inp], parameters={"threshold": 0.3}, request_id="peers-bytes")
        self.assertEqual(r.get_response().id, "peers-bytes")
        # Encoded JPEGs: decode + resize in C++ differ slightly from PIL + torchvision.
        self.check(r, 2e-2, 2.0, "tritonclient BYTES images")

    def test_bytes_images_triton_shape(self):
        # [N, 1]: Triton's layout for a batched BYTES element (what perf_analyzer sends).
        data = np.array([[image(n)] for n in IMAGES], dtype=np.object_)
        inp = grpcclient.InferInput("images", [2, 1], "BYTES")
        inp.set_data_from_numpy(data)
        r = client().infer(DETECTOR, [inp], parameters={"threshold": 0.3})
        self.check(r, 2e-2, 2.0, "tritonclient BYTES images [2,1]")

    def test_fp32_pixel_values(self):
        u8 = self.expected["pixel_u8"].astype(np.float32)
        pixels = (u8 * np.float32(0.00392156862745098)).astype(np.float32)
        self.assertEqual(pixels.shape, (2, 3, 640, 640))
        pv = grpcclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv.set_data_from_numpy(pixels)
        sizes = grpcclient.InferInput("target_sizes", [2, 2], "INT64")
        sizes.set_data_from_numpy(np.array([[512, 512], [400, 600]], dtype=np.int64))
        r = client().infer(DETECTOR, [pv, sizes], parameters={"threshold": 0.3})
        # The fixture's own pixels: the model alone.
        self.check(r, 1e-4, 1e-2, "tritonclient FP32 pixel_values")

    def test_requested_outputs_and_logits(self):
        inp = grpcclient.InferInput("images", [1], "BYTES")
        inp.set_data_from_numpy(np.array([image("coffee.jpg")], dtype=np.object_))
        outs = [grpcclient.InferRequestedOutput("num_detections"), grpcclient.InferRequestedOutput("logits")]
        r = client().infer(DETECTOR, [inp], outputs=outs)
        self.assertEqual([o.name for o in r.get_response().outputs], ["num_detections", "logits"])
        self.assertEqual(r.as_numpy("logits").shape, (1, NUM_QUERIES, NUM_LABELS))
        self.assertIsNone(r.as_numpy("scores"))

    def test_errors(self):
        inp = grpcclient.InferInput("images", [1], "BYTES")
        inp.set_data_from_numpy(np.array([image("coffee.jpg")], dtype=np.object_))
        with self.assertRaises(InferenceServerException) as e:
            client().infer("nope", [inp])
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        self.assertEqual(e.exception.message(), "unknown model 'nope'")
        bad = grpcclient.InferInput("pixel_values", [1, 3, 8, 8], "FP64")
        bad.set_data_from_numpy(np.zeros((1, 3, 8, 8), dtype=np.float64))
        with self.assertRaises(InferenceServerException) as e:
            client().infer(DETECTOR, [bad])
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertIn("pixel_values", e.exception.message())
        corrupt = grpcclient.InferInput("images", [1], "BYTES")
        corrupt.set_data_from_numpy(np.array([image("coffee.jpg")[:200]], dtype=np.object_))
        with self.assertRaises(InferenceServerException) as e:
            client().infer(DETECTOR, [corrupt])
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertIs(client().is_server_ready(), True)

    def test_statistics_move_by_the_right_amounts(self):
        c = client()

        def stats():
            r = c.get_inference_statistics(DETECTOR)
            self.assertEqual(len(r.model_stats), 1)
            return r.model_stats[0]

        before = stats()
        self.assertEqual((before.name, before.version), (DETECTOR, "1"))
        data = np.array([image(n) for n in IMAGES], dtype=np.object_)
        for _ in range(3):
            inp = grpcclient.InferInput("images", [2], "BYTES")
            inp.set_data_from_numpy(data)
            c.infer(DETECTOR, [inp])
        after = stats()
        print(f"\n  statistics: inference_count {before.inference_count} -> {after.inference_count}, "
              f"execution_count {before.execution_count} -> {after.execution_count}, "
              f"success {before.inference_stats.success.count} -> {after.inference_stats.success.count}")
        self.assertEqual(after.inference_count - before.inference_count, 6)  # images
        self.assertEqual(after.inference_stats.success.count - before.inference_stats.success.count, 3)
        self.assertEqual(after.inference_stats.fail.count, before.inference_stats.fail.count)
        # Sequential requests of 2 images: each one batch (the queue delay is 2 ms).
        self.assertEqual(after.execution_count - before.execution_count, 3)
        self.assertGreater(after.inference_stats.compute_infer.ns, before.inference_stats.compute_infer.ns)
        self.assertGreater(after.inference_stats.queue.count, before.inference_stats.queue.count)
        self.assertGreaterEqual(after.last_inference, before.last_inference)
        self.assertGreater(after.last_inference, 1_600_000_000_000)  # ms since the epoch
        b2 = [b for b in after.batch_stats if b.batch_size == 2]
        self.assertEqual(len(b2), 1)
        b2_before = [b.compute_infer.count for b in before.batch_stats if b.batch_size == 2]
        self.assertEqual(b2[0].compute_infer.count - (b2_before[0] if b2_before else 0), 3)
        every = c.get_inference_statistics()
        self.assertEqual(sorted(s.name for s in every.model_stats), [DETECTOR, CLASSIFIER])
        with self.assertRaises(InferenceServerException) as e:
            c.get_inference_statistics("nope")
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")


if __name__ == "__main__":
    unittest.main()
