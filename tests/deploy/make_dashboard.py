#!/usr/bin/env python3
"""Writes deploy/grafana/libreyolo-server.json (the Grafana dashboard) from the panel list below.

Run it after editing the panels: python3 tests/deploy/make_dashboard.py. deploy_test.py checks
that the committed JSON equals what this script produces, and that every metric it queries is
exported by the daemon.
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace="$namespace", model=~"$model"'
NS = 'namespace="$namespace"'


def target(expr, legend, ref, instant=False, fmt=None):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t["instant"] = True
        t["range"] = False
    if fmt:
        t["format"] = fmt
    return t


def timeseries(pid, title, desc, unit, targets, x, y, w=12, h=8):
    return {
        "id": pid, "type": "timeseries", "title": title, "description": desc, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": targets,
    }


def table(pid, title, desc, targets, x, y, w=12, h=8):
    return {
        "id": pid, "type": "table", "title": title, "description": desc, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
        "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        "targets": targets,
    }


def row(pid, title, y):
    return {"id": pid, "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def q(metric, quantile, by="model"):
    return (f"histogram_quantile({quantile}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{SEL}}}[$__rate_interval])))")


def panels():
    p = []
    p.append(row(1, "Requests", 0))
    p.append(timeseries(2, "Request rate", "ModelInfer requests per second by model and gRPC status code.",
                        "reqps", [target(f"sum by (model, code) (rate(libreyolo_inference_requests_total{{{SEL}}}[$__rate_interval]))",
                                         "{{model}} {{code}}", "A")], 0, 1))
    p.append(timeseries(3, "Request latency p50 / p99", "From the libreyolo_request_duration_seconds histogram (inside the server).",
                        "s", [target(q("libreyolo_request_duration_seconds", 0.5), "p50 {{model}}", "A"),
                              target(q("libreyolo_request_duration_seconds", 0.99), "p99 {{model}}", "B")], 12, 1))
    p.append(timeseries(4, "Where the time goes (p99)", "p99 of the queue wait, decode + preprocessing, and forward + post-processing.",
                        "s", [target(q("libreyolo_queue_duration_seconds", 0.99), "queue {{model}}", "A"),
                              target(q("libreyolo_preprocess_duration_seconds", 0.99), "preprocess {{model}}", "B"),
                              target(q("libreyolo_compute_duration_seconds", 0.99), "compute {{model}}", "C")], 0, 9))
    p.append(timeseries(5, "Errors", "Requests answered with a status other than OK, per second.",
                        "reqps", [target(f"sum by (model, code) (rate(libreyolo_inference_requests_total{{{SEL}, code!=\"OK\"}}[$__rate_interval]))",
                                         "{{model}} {{code}}", "A")], 12, 9))
    p.append(row(6, "Batching and queue", 17))
    p.append(timeseries(7, "Batch size", "Images per forward pass: mean, p50 and p99 of libreyolo_batch_size.",
                        "short", [target(f"sum by (model) (rate(libreyolo_batch_size_sum{{{SEL}}}[$__rate_interval])) / "
                                         f"sum by (model) (rate(libreyolo_batch_size_count{{{SEL}}}[$__rate_interval]))",
                                         "mean {{model}}", "A"),
                                  target(q("libreyolo_batch_size", 0.5), "p50 {{model}}", "B"),
                                  target(q("libreyolo_batch_size", 0.99), "p99 {{model}}", "C")], 0, 18, w=8))
    p.append(timeseries(8, "Pending requests", "Requests waiting in the batching queue (RESOURCE_EXHAUSTED at max_queue_size).",
                        "short", [target(f"sum by (pod, model) (libreyolo_pending_requests{{{SEL}}})", "{{pod}} {{model}}", "A")],
                        8, 18, w=8))
    p.append(timeseries(9, "Mean queue wait per pod (HPA metric)", "What prometheus-adapter serves to the HPA as libreyolo_queue_latency_seconds.",
                        "s", [target(f"sum by (pod) (rate(libreyolo_queue_duration_seconds_sum{{{NS}}}[1m])) / "
                                     f"clamp_min(sum by (pod) (rate(libreyolo_queue_duration_seconds_count{{{NS}}}[1m])), 1e-9)",
                                     "{{pod}}", "A")], 16, 18, w=8))
    p.append(row(10, "Kernels", 26))
    p.append(table(11, "Active implementation per slot", "libreyolo_kernel_active == 1: the implementation each slot resolved to, per pod (GET /active has the details).",
                   [target(f"max by (pod, slot, impl) (libreyolo_kernel_active{{{NS}}}) == 1", "", "A", instant=True, fmt="table")],
                   0, 27))
    p.append(table(12, "Fallback events", "libreyolo_kernel_fallback_total: implementations disabled at run time (or hub kernels refused), by reason.",
                   [target(f"sum by (pod, slot, impl, reason) (libreyolo_kernel_fallback_total{{{NS}}}) > 0", "", "A", instant=True, fmt="table")],
                   12, 27))
    p.append(timeseries(13, "Kernel calls", "Calls per second served by each implementation of each slot.",
                        "ops", [target(f"sum by (slot, impl) (rate(libreyolo_kernel_calls_total{{{NS}}}[$__rate_interval]))",
                                       "{{slot}} {{impl}}", "A")], 0, 35))
    p.append(timeseries(14, "Kernel declines", "Inputs an implementation declined (device, dtype, layout...), per second: not failures.",
                        "ops", [target(f"sum by (slot, impl, reason) (rate(libreyolo_kernel_declined_total{{{NS}}}[$__rate_interval]))",
                                       "{{slot}} {{impl}} {{reason}}", "A")], 12, 35))
    p.append(timeseries(15, "Model load time", "Seconds to load and warm up each model version, per pod.",
                        "s", [target(f"max by (pod, model, version) (libreyolo_model_load_seconds{{{SEL}}})",
                                     "{{pod}} {{model}}/{{version}}", "A")], 0, 43, w=24, h=6))
    p.append(row(16, "Instances and GPUs (instance_group)", 49))
    p.append(timeseries(17, "Images per instance", "Images each model instance inferred per second (libreyolo_instance_images_total): how the one queue spreads over the instances.",
                        "short", [target(f"sum by (pod, instance, device) (rate(libreyolo_instance_images_total{{{SEL}}}[$__rate_interval]))",
                                         "{{pod}} {{instance}} {{device}}", "A")], 0, 50, w=8))
    p.append(timeseries(18, "Mean queue wait per instance", "Seconds the requests an instance took waited in the queue, over those requests.",
                        "s", [target(f"sum by (pod, instance) (rate(libreyolo_instance_queue_seconds_total{{{SEL}}}[$__rate_interval])) / "
                                     f"clamp_min(sum by (pod, instance) (rate(libreyolo_instance_requests_total{{{SEL}}}[$__rate_interval])), 1e-9)",
                                     "{{pod}} {{instance}}", "A")], 8, 50, w=8))
    p.append(timeseries(19, "Instances in rotation", "libreyolo_instance_ready: 0 once an instance's device failed (CUDA error, out of memory); libreyolo_instance_failures_total counts the take-outs.",
                        "short", [target(f"sum by (pod, instance, device) (libreyolo_instance_ready{{{SEL}}})", "{{pod}} {{instance}} {{device}}", "A")],
                        16, 50, w=8))
    p.append(timeseries(20, "GPU memory", "Per GPU an instance uses: used by every process, and what this daemon's caching allocator reserved and its tensors hold.",
                        "bytes", [target(f"max by (pod, device) (libreyolo_gpu_memory_used_bytes{{{NS}}})", "used {{pod}} {{device}}", "A"),
                                  target(f"max by (pod, device) (libreyolo_gpu_memory_reserved_bytes{{{NS}}})", "reserved {{pod}} {{device}}", "B"),
                                  target(f"max by (pod, device) (libreyolo_gpu_memory_allocated_bytes{{{NS}}})", "allocated {{pod}} {{device}}", "C"),
                                  target(f"max by (pod, device) (libreyolo_gpu_memory_total_bytes{{{NS}}})", "total {{pod}} {{device}}", "D")],
                        0, 58, w=24))
    return p


def dashboard():
    def var(name, label, query):
        return {"name": name, "label": label, "type": "query", "datasource": DS,
                "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
                "includeAll": name == "model", "multi": name == "model", "allValue": ".*" if name == "model" else None,
                "current": {}, "sort": 1}
    variables = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "refresh": 1},
        var("namespace", "Namespace", "label_values(libreyolo_kernel_active, namespace)"),
        var("model", "Model", 'label_values(libreyolo_model_load_seconds{namespace="$namespace"}, model)'),
    ]
    for v in variables:
        if v.get("allValue", 1) is None:
            del v["allValue"]
    return {
        "uid": "libreyolo-server", "title": "libreyolo-server", "tags": ["libreyolo", "inference"],
        "description": "libreyolo-server: requests, latency histograms, batching, queue, kernel registry (deploy/grafana).",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "templating": {"list": variables}, "annotations": {"list": []}, "links": [],
        "panels": panels(),
    }


def render():
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.join(root, "deploy", "grafana", "libreyolo-server.json")
    if len(sys.argv) > 1:
        out = sys.argv[1]
    with open(out, "w") as f:
        f.write(render())
    print("wrote", out)
