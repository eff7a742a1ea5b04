"""The anchor of bench_preprocess's GPU row (tools/bench_preprocess/bench_preprocess_gpu.cpp):
what a PyTorch deployer runs instead, on the same files and batch sizes.

  --make DIR   writes the benchmark's JPEGs into DIR (when it holds none): the fixture
               photographs (tests/fixtures/images: astronaut, chelsea, coffee) resized to 640x480
               (PIL bicubic), each also flipped left-right, top-bottom and both, saved as
               baseline 4:2:0 JPEGs at qualities 75, 85 and 95 (PIL / libjpeg-turbo): 36 files.
  --dir DIR    times, for each --batch B, batches of B files (cycled through DIR's sorted
               *.jpg): torchvision.io.decode_jpeg(list of B byte tensors, device="cuda") (nvJPEG,
               batched), torch.stack, then torchvision.transforms.v2 on the GPU:
               Resize((640, 640)) (bilinear, antialias=True), ToDtype(float32, scale=True),
               Normalize(ImageNet mean/std), then .to(bfloat16). CUDA events around each batch,
               as the C++ row; prints one line per batch size:
                 anchor torchvision batch=B images_per_s=X ms_per_batch=Y
               and writes them as JSON with --json.

Usage (scripts/bench-decode-gpu.sh runs both sides):
  python decode_anchor.py --make /tmp/decode-jpegs
  python decode_anchor.py --dir /tmp/decode-jpegs --batch 32,128 [--iters 50] [--json out.json]
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHOTOS = ["astronaut.jpg", "chelsea.jpg", "coffee.jpg"]
QUALITIES = [75, 85, 95]


def make(out_dir: pathlib.Path) -> None:
    from PIL import Image, ImageOps

    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.glob("*.jpg")):
        print(f"decode_anchor: {out_dir} already holds JPEGs; kept")
        return
    n = 0
    for photo in PHOTOS:
        base = Image.open(ROOT / "tests/fixtures/images" / photo).convert("RGB")
        base = base.resize((640, 480), Image.BICUBIC)
        variants = {
            "plain": base,
            "mirror": ImageOps.mirror(base),
            "flip": ImageOps.flip(base),
            "both": ImageOps.flip(ImageOps.mirror(base)),
        }
        for name, im in variants.items():
            for q in QUALITIES:
                path = out_dir / f"{pathlib.Path(photo).stem}_{name}_q{q}_420_640x480.jpg"
                im.save(path, "JPEG", quality=q, subsampling=2, progressive=False, optimize=False)
                n += 1
    print(f"decode_anchor: wrote {n} JPEGs (640x480, 4:2:0, baseline) to {out_dir}")


def bench(in_dir: pathlib.Path, batches, iters: int, warmup: int):
    import torch
    import torchvision
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    if not torch.cuda.is_available():
        sys.exit("decode_anchor: no CUDA device")
    files = sorted(in_dir.glob("*.jpg"))
    if not files:
        sys.exit(f"decode_anchor: no .jpg files in {in_dir}")
    data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    transform = v2.Compose(
        [
            v2.Resize((640, 640), interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    rows = []
    for b in batches:
        nxt = 0

        def one_batch():
            nonlocal nxt
            chunk = [data[(nxt + i) % len(data)] for i in range(b)]
            nxt = (nxt + b) % len(data)
            images = decode_jpeg(chunk, device="cuda")
            return transform(torch.stack(images)).to(torch.bfloat16)

        with torch.inference_mode():
            for _ in range(warmup):
                one_batch()
            torch.cuda.synchronize()
            total_ms = 0.0
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                out = one_batch()
                stop.record()
                stop.synchronize()
                total_ms += start.elapsed_time(stop)
        assert out.shape == (b, 3, 640, 640) and out.dtype == torch.bfloat16
        row = {
            "side": "torchvision",
            "batch": b,
            "images_per_s": b * iters / (total_ms / 1000.0),
            "ms_per_batch": total_ms / iters,
            "files": len(files),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
        }
        print(
            f"anchor torchvision batch={b} images_per_s={row['images_per_s']:.1f} "
            f"ms_per_batch={row['ms_per_batch']:.3f}"
        )
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make", type=pathlib.Path, help="write the benchmark's JPEGs into this folder")
    ap.add_argument("--dir", type=pathlib.Path, help="time torchvision on this folder's JPEGs")
    ap.add_argument("--batch", default="32,128", help="comma-separated batch sizes")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", type=pathlib.Path, help="write the rows here")
    a = ap.parse_args()
    if not a.make and not a.dir:
        ap.error("give --make DIR and/or --dir DIR")
    if a.make:
        make(a.make)
    if a.dir:
        rows = bench(a.dir, [int(x) for x in a.batch.split(",") if x], a.iters, a.warmup)
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
