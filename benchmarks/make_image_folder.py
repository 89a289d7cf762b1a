"""Write a 10-class ImageFolder tree from Fashion-MNIST, for the image recipes' small real variant.

No ImageNet subset can be had offline here, so the ImageNet-style pipeline (ImageFolder tree, PNG decoding in
threads, RandomResizedCrop + flip, resize + center crop) is exercised on the one natural-ish local image set: each
28x28 Fashion-MNIST image is upscaled (bicubic) to ``--size`` pixels and saved as an RGB PNG under
``OUT/{train,val}/<class name>/``. ``--train-per-class`` / ``--val-per-class`` take the first images of each class
(the IDX order, which is shuffled already), so the tree is the same on every run.

Run:  .venv/bin/python benchmarks/make_image_folder.py OUT [--size 64] [--train-per-class 1000] [--val-per-class 200]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxcomposer.data import FASHION_MNIST_CLASSES, load_fashion_mnist  # noqa: E402


def write_split(out: Path, images: np.ndarray, labels: np.ndarray, per_class: int, size: int) -> int:
    written = 0
    for c, name in enumerate(FASHION_MNIST_CLASSES):
        folder = out / name.replace("/", "-").replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        for i, idx in enumerate(np.flatnonzero(labels == c)[:per_class]):
            img = Image.fromarray(images[idx].reshape(28, 28)).convert("RGB").resize((size, size), Image.BICUBIC)
            img.save(folder / f"{i:05d}.png")
            written += 1
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--train-per-class", type=int, default=1000)
    ap.add_argument("--val-per-class", type=int, default=200)
    args = ap.parse_args(argv)
    if (args.out / "train").exists() or (args.out / "val").exists():
        raise SystemExit(f"{args.out} already holds train/ or val/: choose an empty folder")
    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    n_train = write_split(args.out / "train", train["input"], train["target"], args.train_per_class, args.size)
    n_val = write_split(args.out / "val", test["input"], test["target"], args.val_per_class, args.size)
    print(f"wrote {n_train} train and {n_val} val images ({args.size}x{args.size} RGB PNG) under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
