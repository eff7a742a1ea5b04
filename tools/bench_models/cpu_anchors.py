"""The CPU anchors of the end-to-end benchmark (issue 35, docs/BENCHMARKS.md): ONNX Runtime,
OpenVINO, transformers eager and torch.compile + freezing on the checkpoint folders of
make_random_checkpoint.py, timed in interleaved rounds with libreyolo-bench-models (--ours).

Usage: cpu_anchors.py CKPT_DIR [--batch 1,8] [--size 640|HxW] [--threads 2] [--rounds 3]
                      [--iters 3] [--warmup 1] [--runtimes ort,openvino,eager,compile]
                      (also openvino_bf16, compile_bf16)
                      [--work DIR] [--ours "CMD ..."] [--wait-quiet SECONDS]

What each anchor is (what its users run, fp32):
  ort       torch.onnx.export of the model (the dynamo exporter first, the TorchScript exporter,
            dynamo=False at opset 17, where dynamo fails), static shapes per batch, run by
            onnxruntime.InferenceSession: CPUExecutionProvider, ORT_ENABLE_ALL, intra_op_num_threads
            = --threads, inter_op 1, ORT_SEQUENTIAL
  openvino  the same .onnx file through openvino.Core().compile_model on "CPU" with
            INFERENCE_NUM_THREADS = --threads, PERFORMANCE_HINT LATENCY and
            INFERENCE_PRECISION_HINT f32
  openvino_bf16  the same with INFERENCE_PRECISION_HINT bf16: what OpenVINO runs by default on a
            CPU with AVX-512 BF16 or AMX (its CPU plugin's default precision there)
  eager     transformers' model, eval(), torch.inference_mode, torch.set_num_threads(--threads)
  compile   torch.compile(model) with torch._inductor.config.freezing = True (weights folded as
            constants, BatchNorm into the convolutions), one compile per batch size
  compile_bf16  the same on the model in bfloat16 (input cast to bfloat16, outputs back to
            float32 for the check): what a PyTorch user runs on a CPU with AMX
  ours      --ours [LABEL=]CMD (repeatable; LABEL defaults to ours) is run once per round with
            `--batch B --iters I --warmup W` appended and OMP_NUM_THREADS = --threads
            (libreyolo-bench-models; it prints median_ms / min_ms and, printed from round 0 as
            `ours_binding`, which implementation served each kernel slot); each round runs every
            --ours, then every anchor, so a change in the machine's load falls on all of them
Before timing, the output check: every LayerNorm's eps is set to 1e-30 (in the model that is
exported, compiled and run eagerly; it costs nothing), which breaks the ties of the random-weight
query selection (random weights make the encoder's scores nearly equal, so top-k ties would
break differently per runtime and the boxes would not be comparable); then logits and
pred_boxes of every anchor are compared with eager on the same random input (max abs diff).
The model class follows config.json (AutoModelForObjectDetection: RT-DETR, D-FINE, ...).
On a shared machine (other builds, other benchmarks), --wait-quiet S waits up to S seconds before
each measurement until the other processes take less than 0.1 of the CPU, and every measurement
records `others_cpu`: the fraction of all cores that other processes used while it ran
(/proc/stat less this process and its children). Prints `export ...`, `check ...`, `round ...`
lines, `noise ...` lines at the start and end of every round (1-minute load average, running
compilers) and, per (batch, runtime), `result model=M batch=B runtime=R median_ms_per_image=X
min_ms_per_image=Y rounds=N of=M iters=I`: over the N of M measurements that were quiet
(others_cpu < --quiet, default 0.15; all M where none was), the median of their medians and the
least single forward, divided by B.
Needs tools/bench_models/requirements-cpu-anchors.txt (not CI's requirements). Exit codes: 0 ok,
1 a runtime failed, 2 usage error.
"""
import argparse
import copy
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import transformers as tr

RUNTIMES = ("ort", "openvino", "eager", "compile")  # the default --runtimes
ALL_RUNTIMES = RUNTIMES + ("openvino_bf16", "compile_bf16")


class Heads(torch.nn.Module):
    """The model as (logits, pred_boxes): what torch.onnx.export and the check see."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return out.logits, out.pred_boxes


def break_ties(model):
    """Every torch.nn.LayerNorm's eps -> 1e-30 (see the docstring); returns how many."""
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = 1e-30
            n += 1
    return n


def export(model, x, path):
    """torch.onnx.export to `path`: dynamo first, TorchScript (opset 17) where it raises.
    Returns (exporter, opset, why dynamo failed or "")."""
    import onnx
    heads = Heads(model).eval()
    names = dict(input_names=["pixel_values"], output_names=["logits", "pred_boxes"])
    why = ""
    try:
        torch.onnx.export(heads, (x,), path, dynamo=True, **names)
        exporter = "dynamo"
    except Exception as e:  # the exporter's own error types vary by torch version
        root = e
        while root.__cause__ is not None:  # the exporter wraps the error of the failing step
            root = root.__cause__
        text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(root).__name__}: {root}")
        why = " ".join(text.split())[:300]
        torch.onnx.export(heads, (x,), path, dynamo=False, opset_version=17, **names)
        exporter = "torchscript"
    m = onnx.load(path, load_external_data=False)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), -1)
    return exporter, opset, why


def ort_runner(path, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"pixel_values": x})


def openvino_runner(path, threads, precision="f32"):
    import openvino as ov
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                     "PERFORMANCE_HINT": "LATENCY",
                                                     "INFERENCE_PRECISION_HINT": precision})
    req = compiled.create_infer_request()

    def run(x):
        req.infer({0: x})
        return [req.get_output_tensor(i).data for i in range(2)]
    return run


def torch_runner(fn, dtype=torch.float32):
    def run(x):
        with torch.inference_mode():
            return [t.float().numpy() for t in fn(torch.from_numpy(x).to(dtype))]
    return run


def time_forwards(run, x, iters, warmup):
    for _ in range(warmup):
        run(x)
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run(x)
        ms.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(ms), min(ms)


def parse_ours(text):
    """'LABEL=CMD' -> (LABEL, CMD); a CMD without a label is 'ours'."""
    found = re.match(r"([A-Za-z0-9_]+)=(.*)", text)
    if found and " " not in found.group(1):
        return found.group(1), found.group(2)
    return "ours", text


def run_ours(cmd, batch, iters, warmup, threads):
    """One call of libreyolo-bench-models with OMP_NUM_THREADS = threads; returns (median_ms,
    min_ms) of its forward and its `binding` lines (which implementation served each slot)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    argv = shlex.split(cmd) + ["--batch", str(batch), "--iters", str(iters), "--warmup", str(warmup)]
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    found = re.search(r"median_ms=([0-9.e+]+) min_ms=([0-9.e+]+)", p.stdout)
    if p.returncode != 0 or not found:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-400:]}")
    bindings = [line for line in p.stdout.splitlines() if line.startswith("binding ")]
    return float(found.group(1)), float(found.group(2)), bindings


def machine_noise():
    """(1-min load average, how many compilers run): printed with every round."""
    builds = subprocess.run(["pgrep", "-x", "cc1plus"], capture_output=True, text=True)
    return os.getloadavg()[0], len(builds.stdout.split())


class OthersCpu:
    """The CPU time other processes took while a measurement ran, as a fraction of every core
    over its wall time: the machine's busy time (/proc/stat) less this process's and its
    children's (os.times). 0 on a quiet machine; 0.5 on 2 cores = one core's worth taken."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait, in jiffies
        t = os.times()
        ours = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), ours

    def fraction(self):
        wall0, busy0, ours0 = self.start
        wall1, busy1, ours1 = self._sample()
        if wall1 - wall0 <= 0:
            return 0.0
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / ((wall1 - wall0) * os.cpu_count())


def wait_quiet(limit_s, below=0.1):
    """Waits up to limit_s until others took less than `below` of the CPU over one second."""
    end = time.time() + limit_s
    while time.time() < end:
        probe = OthersCpu()
        time.sleep(1)
        if probe.fraction() < below:
            return


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--size", default="640")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--runtimes", default=",".join(RUNTIMES))
    p.add_argument("--work", default="/tmp/libreyolo-cpu-anchors")
    p.add_argument("--ours", action="append", default=[],
                   help="[LABEL=]CMD, repeatable: each is timed in every round as runtime LABEL")
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="seconds to wait before each measurement for others' CPU < 0.1")
    p.add_argument("--quiet", type=float, default=0.15,
                   help="a measurement is quiet when others took less than this of the CPU")
    a = p.parse_args()
    runtimes = a.runtimes.split(",")
    if set(runtimes) - set(ALL_RUNTIMES) or a.threads < 1 or a.rounds < 1 or a.iters < 1 or a.warmup < 0:
        p.print_usage(sys.stderr)
        return 2
    h, _, w = a.size.partition("x")
    height, width = int(h), int(w or h)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    name = os.path.basename(a.ckpt.rstrip("/"))
    model = tr.AutoModelForObjectDetection.from_pretrained(a.ckpt).eval()
    print(f"setup model={name} layernorms_eps_1e-30={break_ties(model)} threads={a.threads} "
          f"torch={torch.__version__} transformers={tr.__version__}", flush=True)
    os.makedirs(a.work, exist_ok=True)
    failed = False
    for batch in [int(b) for b in a.batch.split(",")]:
        x = torch.rand(batch, 3, height, width)
        xn = x.numpy()
        with torch.inference_mode():
            ref = [t.numpy() for t in Heads(model)(x)]
        runners = {}
        path = os.path.join(a.work, f"{name}_b{batch}.onnx")
        if {"ort", "openvino", "openvino_bf16"} & set(runtimes):
            t0 = time.time()
            exporter, opset, why = export(model, x, path)
            print(f"export model={name} batch={batch} exporter={exporter} opset={opset} "
                  f"seconds={time.time() - t0:.0f}" + (f" dynamo_failed={json.dumps(why)}" if why else ""),
                  flush=True)
        for rt in runtimes:
            t0 = time.time()
            if rt == "ort":
                runners[rt] = ort_runner(path, a.threads)
            elif rt in ("openvino", "openvino_bf16"):
                runners[rt] = openvino_runner(path, a.threads, "bf16" if rt == "openvino_bf16" else "f32")
            elif rt == "eager":
                runners[rt] = torch_runner(Heads(model))
            else:
                torch._dynamo.reset()
                torch._inductor.config.freezing = True
                if rt == "compile_bf16":
                    heads = Heads(copy.deepcopy(model).to(torch.bfloat16)).eval()
                    runners[rt] = torch_runner(torch.compile(heads), torch.bfloat16)
                else:
                    runners[rt] = torch_runner(torch.compile(Heads(model)))
            out = runners[rt](xn)  # compiles (torch.compile), allocates (ORT, OpenVINO)
            diffs = [float(np.abs(np.asarray(o) - r).max()) for o, r in zip(out, ref)]
            print(f"check model={name} batch={batch} runtime={rt} logits_max_abs={diffs[0]:.3g} "
                  f"boxes_max_abs={diffs[1]:.3g} setup_s={time.time() - t0:.0f}", flush=True)
        ours = dict(parse_ours(o) for o in a.ours)
        order = list(ours) + runtimes
        per = {rt: [] for rt in order}
        for r in range(a.rounds):
            load, builds = machine_noise()
            print(f"noise round={r} at=start loadavg_1m={load:.2f} compilers={builds}", flush=True)
            for rt in order:
                if a.wait_quiet > 0:
                    wait_quiet(a.wait_quiet)
                others = OthersCpu()
                try:
                    if rt in ours:
                        med, low, bindings = run_ours(ours[rt], batch, a.iters, a.warmup, a.threads)
                        for line in bindings if r == 0 else []:
                            print(f"ours_binding runtime={rt} {line[len('binding '):]}", flush=True)
                    else:
                        med, low = time_forwards(runners[rt], xn, a.iters, a.warmup)
                except Exception as e:
                    print(f"round model={name} batch={batch} round={r} runtime={rt} failed: {e}", flush=True)
                    failed = True
                    continue
                busy = others.fraction()
                per[rt].append((med, low, busy))
                print(f"round model={name} batch={batch} round={r} runtime={rt} median_ms={med:.1f} "
                      f"min_ms={low:.1f} others_cpu={busy:.2f}", flush=True)
            load, builds = machine_noise()
            print(f"noise round={r} at=end loadavg_1m={load:.2f} compilers={builds}", flush=True)
        for rt in order:
            # The quiet measurements (others took < --quiet of the CPU) where there are any.
            quiet = [m for m in per[rt] if m[2] < a.quiet] or per[rt]
            if quiet:
                med = statistics.median(m for m, _, _ in quiet) / batch
                low = min(lo for _, lo, _ in quiet) / batch
                print(f"result model={name} batch={batch} runtime={rt} median_ms_per_image={med:.1f} "
                      f"min_ms_per_image={low:.1f} rounds={len(quiet)} of={len(per[rt])} "
                      f"iters={a.iters}", flush=True)
        runners.clear()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
