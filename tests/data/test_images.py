"""Image classification from files: ImageFolder trees and TFDS image datasets, torchvision's ImageNet transforms,
exact resume with per-example randomness, threaded decoding."""

import io
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from jaxcomposer.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageFolderSource,
    ImageLoader,
    dataset_kind,
    eval_transform,
    make_loaders,
    train_transform,
)
from jaxcomposer.data.images import _AUGMENT_TAG, random_resized_crop_box
from jaxcomposer.data.loader import derive_seed
from jaxcomposer.errors import DataError, DatasetNotFoundError

SIZE = 16
# (class folder, file name, (width, height), PIL mode, format); class names sort as torchvision's: "Cat" < "ant" < "dog"
FILES = [
    ("dog", "d0.jpg", (53, 37), "RGB", "JPEG"),
    ("dog", "d1.PNG", (24, 40), "L", "PNG"),
    ("dog", "nested/d2.png", (31, 31), "RGBA", "PNG"),
    ("Cat", "c0.png", (40, 24), "RGB", "PNG"),
    ("Cat", "c1.jpeg", (19, 66), "L", "JPEG"),
    ("ant", "a0.png", (45, 30), "P", "PNG"),
    ("ant", "a1.png", (28, 29), "RGB", "PNG"),
    ("ant", "a2.bmp", (60, 20), "RGB", "BMP"),
]
CLASSES = ["Cat", "ant", "dog"]


def _picture(width, height, mode, seed):
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    if mode == "P":
        return rgb.quantize(16)
    return rgb.convert(mode)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagefolder")
    for split in ("train", "val"):
        for k, (cls, name, (w, h), mode, fmt) in enumerate(FILES):
            path = root / split / cls / name
            path.parent.mkdir(parents=True, exist_ok=True)
            _picture(w, h, mode, seed=k + (100 if split == "val" else 0)).save(path, fmt)
        (root / split / "dog" / "notes.txt").write_text("not an image")  # ignored, as by torchvision
    return root


def _batches(loader):
    return [{k: v.copy() for k, v in b.items()} for b in loader]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


# -- listing ------------------------------------------------------------------------------------------------
def test_image_folder_classes_files_and_labels_follow_torchvision(tree):
    source = ImageFolderSource(tree / "train")
    assert source.classes == CLASSES
    # files walked per class in sorted order (os.walk sorted, file names sorted), only image extensions
    got = [p.split("/train/")[1] for p in source.paths]
    assert got == ["Cat/c0.png", "Cat/c1.jpeg", "ant/a0.png", "ant/a1.png", "ant/a2.bmp", "dog/d0.jpg", "dog/d1.PNG",
                   "dog/nested/d2.png"]
    np.testing.assert_array_equal(source.labels, [0, 0, 1, 1, 1, 2, 2, 2])
    assert not any(p.endswith(".txt") for p in source.paths)


def test_missing_root_and_empty_class_name_the_path(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "nowhere")):
        ImageFolderSource(tmp_path / "nowhere")
    (tmp_path / "tree" / "full").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp_path / "tree" / "full" / "x.png")
    (tmp_path / "tree" / "empty").mkdir()
    (tmp_path / "tree" / "empty" / "readme.md").write_text("no images")
    with pytest.raises(DataError, match=str(tmp_path / "tree" / "empty")):
        ImageFolderSource(tmp_path / "tree")
    with pytest.raises(DatasetNotFoundError, match="needs data_dir"):
        make_loaders("imagefolder", 2, 2)
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "tree" / "train")):
        make_loaders("imagefolder", 2, 2, data_dir=tmp_path / "tree")
    with pytest.raises(DatasetNotFoundError, match="no ImageFolder tree") as info:
        make_loaders("imagenet", 2, 2, data_dir=tmp_path / "void")
    assert "imagenet2012" in str(info.value) and "val/<wnid>" in str(info.value)


# -- transforms ---------------------------------------------------------------------------------------------
def test_eval_transform_is_resize_shorter_side_then_center_crop():
    image = _picture(53, 37, "RGB", seed=0)
    # size 16: shorter side -> int(16 / 0.875) = 18, longer -> int(18 * 53 / 37) = 25; crop top round(1.0) = 1,
    # left round(4.5) = 4 (Python's, and torchvision's, round half to even)
    want = image.resize((25, 18), Image.Resampling.BILINEAR).crop((4, 1, 20, 17))
    got = eval_transform(image, 16)
    assert got.size == (16, 16)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    tall = _picture(19, 66, "RGB", seed=1)  # portrait: width is the shorter side; 224 -> 256 as in the recipe
    want = tall.resize((256, int(256 * 66 / 19)), Image.Resampling.BILINEAR)
    top = int(round((want.size[1] - 224) / 2.0))
    np.testing.assert_array_equal(np.asarray(eval_transform(tall, 224)),
                                  np.asarray(want.crop((16, top, 240, top + 224))))
    # Composer's ResNet recipes: resize the shorter side to 232, crop 224
    want = tall.resize((232, int(232 * 66 / 19)), Image.Resampling.BILINEAR)
    top = int(round((want.size[1] - 224) / 2.0))
    np.testing.assert_array_equal(np.asarray(eval_transform(tall, 224, resize=232)),
                                  np.asarray(want.crop((4, top, 228, top + 224))))


def test_random_resized_crop_boxes_stay_inside_and_follow_scale_and_ratio():
    for width, height in ((53, 37), (19, 66), (500, 375)):
        rng = np.random.default_rng(width)
        for _ in range(300):
            top, left, h, w = random_resized_crop_box(width, height, rng)
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h > 0 and w > 0
            if (width, height) == (500, 375):  # large enough that rounding barely moves area and ratio
                assert 0.08 * 0.97 <= h * w / (width * height) <= 1.0
                assert 3 / 4 * 0.97 <= w / h <= 4 / 3 * 1.03
    # the fallback (no sampled box fits) is the centered whole image clipped to the ratio range: a 1 x 40 strip
    assert random_resized_crop_box(40, 1, np.random.default_rng(0)) == (0, 19, 1, 1)


def test_train_transform_is_crop_resize_then_flip_half_the_time():
    image = _picture(53, 37, "RGB", seed=3)
    flips = 0
    for seed in range(400):
        rng = np.random.default_rng(seed)
        top, left, h, w = random_resized_crop_box(53, 37, rng)
        flip = rng.random() < 0.5
        want = image.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        want = np.asarray(want)[:, ::-1] if flip else np.asarray(want)
        np.testing.assert_array_equal(np.asarray(train_transform(image, SIZE, np.random.default_rng(seed))), want)
        flips += flip
    assert 160 < flips < 240  # Binomial(400, 1/2): mean 200, sd 10


# -- the loader ---------------------------------------------------------------------------------------------
def test_eval_loader_yields_center_crops_in_file_order_as_rgb(tree):
    train, evals, info = make_loaders("imagefolder", 3, 3, seed=5, data_dir=tree, image_size=SIZE, num_workers=2)
    assert (info.num_classes, info.input_shape, info.num_train, info.num_eval) == (3, (SIZE, SIZE, 3), 8, 8)
    assert (info.mean, info.std) == (IMAGENET_MEAN, IMAGENET_STD) and dataset_kind("imagefolder") == "image"
    assert isinstance(train, ImageLoader) and train.train and not evals.train and len(train) == 2 and len(evals) == 3
    batches = _batches(evals)
    images = np.concatenate([b["input"] for b in batches])
    targets = np.concatenate([b["target"] for b in batches])
    assert images.shape == (8, SIZE, SIZE, 3) and images.dtype == np.uint8 and targets.dtype == np.int32
    source = evals.source
    np.testing.assert_array_equal(targets, source.labels)
    for k, path in enumerate(source.paths):
        with Image.open(path) as opened:
            want = eval_transform(opened.convert("RGB"), SIZE)
        np.testing.assert_array_equal(images[k], np.asarray(want), err_msg=path)


def test_train_examples_are_seeded_by_seed_epoch_batch_and_position(tree):
    loader = ImageLoader(ImageFolderSource(tree / "train"), 3, image_size=SIZE, train=True, shuffle=True, seed=11,
                         drop_last=True, num_workers=0)
    loader.set_epoch(1)
    indices = loader.epoch_indices(1)
    for b, batch in enumerate(loader):
        for pos, index in enumerate(indices[b]):
            with Image.open(loader.source.paths[index]) as opened:
                rng = np.random.default_rng(derive_seed(11, 1, b, pos, _AUGMENT_TAG))
                want = np.asarray(train_transform(opened.convert("RGB"), SIZE, rng))
            np.testing.assert_array_equal(batch["input"][pos], want)
            assert batch["target"][pos] == loader.source.labels[index]


def test_resume_mid_epoch_gives_identical_batches_and_workers_do_not_matter(tree):
    def loader(workers):
        return ImageLoader(ImageFolderSource(tree / "train"), 2, image_size=SIZE, train=True, shuffle=True, seed=3,
                           drop_last=True, num_workers=workers)

    serial = loader(1)
    full = _batches(serial) + _batches(serial)  # epochs 0 and 1
    threaded = loader(4)
    _assert_same(_batches(threaded) + _batches(threaded), full)
    threaded.close()
    assert not all(np.array_equal(a["input"], b["input"]) for a, b in zip(full[:4], full[4:]))  # new crops per epoch

    first = loader(3)
    it = iter(first)
    head = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(first.get_state()))
    resumed = loader(2)
    resumed.set_state(state)
    rest = _batches(resumed)
    _assert_same([{k: v.copy() for k, v in b.items()} for b in head] + rest, full[:4])
    _assert_same(_batches(resumed), full[4:])


# -- TFDS -----------------------------------------------------------------------------------------------------
class TinyPngImages(tfds.core.GeneratorBasedBuilder):
    """An encoded-image dataset (like imagenet2012's JPEGs), built offline: TFDS stores the bytes as given."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = None  # see tests/data/test_datasets.py: a local builder has no checksums file

    def _info(self):
        features = {"image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
                    "label": tfds.features.ClassLabel(names=["x", "y"])}
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(6, 0), "validation": self._generate_examples(4, 50)}

    def _generate_examples(self, n, offset):
        for i in range(n):
            buffer = io.BytesIO()
            _picture(20 + i, 30, "RGB", seed=offset + i).save(buffer, "PNG")
            yield i, {"image": buffer.getvalue(), "label": i % 2}


def test_tfds_images_are_decoded_and_transformed_on_the_host(tmp_path):
    TinyPngImages(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    train, evals, info = make_loaders("imagenet", 2, 3, seed=0, data_dir=tmp_path, tfds_name="tiny_png_images",
                                      image_size=SIZE, num_workers=2)
    assert (info.num_classes, info.num_train, info.num_eval, info.input_shape) == (2, 6, 4, (SIZE, SIZE, 3))
    assert evals.classes == ["x", "y"]
    batches = _batches(evals)
    images = np.concatenate([b["input"] for b in batches])
    targets = np.concatenate([b["target"] for b in batches])
    # records come back in array_record order, not key order: match each to its source image by content
    wants = {i: np.asarray(eval_transform(_picture(20 + i, 30, "RGB", seed=50 + i), SIZE)) for i in range(4)}
    matched = sorted(next(i for i, w in wants.items() if np.array_equal(w, image)) for image in images)
    assert matched == [0, 1, 2, 3]
    for image, target in zip(images, targets):
        i = next(i for i, w in wants.items() if np.array_equal(w, image))
        assert target == i % 2
    first = _batches(train)
    assert [b["input"].shape for b in first] == [(2, SIZE, SIZE, 3)] * 3
