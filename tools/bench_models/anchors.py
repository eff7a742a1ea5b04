"""The anchors of the end-to-end benchmark (docs/BENCHMARKS.md): transformers 5.17 eager and
torch.compile on the same checkpoint folders, input sizes and batches as libreyolo-bench-models.

Usage: anchors.py CKPT_DIR [--batch 1,32] [--size 640] [--iters 20] [--warmup 5]
                  [--modes eager_fp32,eager_bf16_cl,compile_bf16_cl]
Prints one line per (mode, batch): `anchor mode=M batch=B ms=X img_s=Y tf32=on|off`.
Times are CUDA-event medians of --iters forwards after --warmup (the compile time is in the
warm-up and printed separately as `compile_s`). TF32 is off for the fp32 mode (what parity runs)
and irrelevant for bf16.
"""
import argparse
import statistics
import sys
import time

import torch
import transformers as tr


def timed(fn, x, iters, warmup):
    for _ in range(warmup):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--modes", default="eager_fp32,eager_bf16_cl,compile_bf16_cl")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    model = tr.AutoModelForObjectDetection.from_pretrained(a.ckpt).eval().cuda()
    for mode in a.modes.split(","):
        bf16 = "bf16" in mode
        m = model.to(torch.bfloat16 if bf16 else torch.float32)
        fmt = torch.channels_last if mode.endswith("_cl") else torch.contiguous_format
        m = m.to(memory_format=fmt)
        fn = m
        if mode.startswith("compile"):
            fn = torch.compile(m)
        for b in [int(x) for x in a.batch.split(",")]:
            x = torch.randn(b, 3, a.size, a.size, device="cuda",
                            dtype=torch.bfloat16 if bf16 else torch.float32)
            x = x.contiguous(memory_format=fmt)
            with torch.inference_mode():
                t0 = time.time()
                run = lambda t: fn(pixel_values=t)
                if mode.startswith("compile"):
                    run(x)
                    torch.cuda.synchronize()
                    print(f"anchor mode={mode} batch={b} compile_s={time.time() - t0:.1f}", flush=True)
                ms = timed(run, x, a.iters, a.warmup)
            print(f"anchor model={a.ckpt.rstrip('/').split('/')[-1]} mode={mode} batch={b} "
                  f"ms={ms:.3f} img_s={b * 1000.0 / ms:.1f} tf32=off", flush=True)


if __name__ == "__main__":
    sys.exit(main())
