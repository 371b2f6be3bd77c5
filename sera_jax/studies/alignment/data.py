"""Image-classification data: scikit-learn's bundled digits and ImageNet-1k through tfds.

* `load_digits_split` — the 1,797 real 8x8 handwritten digits that ship inside
  scikit-learn (no download), split train/val by a seeded permutation, standardised with
  the train split's mean/std, NHWC float32.
* `imagenet_dataset` — `imagenet2012` from a user `data_dir` (prepared TFRecords) or built
  from the two ILSVRC tars in `manual_dir`; RandomResizedCrop 224 + horizontal flip for
  training, resize-256 / center-crop-224 for evaluation, ImageNet mean/std normalisation.
  When the data is absent the error says exactly how to prepare it. Nothing downloads.

Batches are dicts of NumPy arrays: `image` float32 `[B, H, W, C]`, `label` int32 `[B]`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import numpy as np

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ArraySplit:
    """An in-memory split: `images` float32 `[N, H, W, C]`, `labels` int32 `[N]`."""

    images: np.ndarray
    labels: np.ndarray
    num_classes: int

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def load_digits_split(split: str, *, val_fraction: float = 0.2, seed: int = 0) -> ArraySplit:
    """Deterministic train/val split of sklearn's digits (same seed -> same split).

    The permutation is drawn from `numpy.random.default_rng(seed)`; the first
    `round(val_fraction * 1797)` shuffled images are `val`, the rest `train`. Pixels (0..16)
    are standardised with the *train* split's mean and std, so `val` sees no val statistics.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split={split!r}; allowed 'train' or 'val'")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction}; allowed (0, 1)")
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.astype(np.float32)[..., None]  # [1797, 8, 8, 1], values 0..16
    y = d.target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_val = int(round(val_fraction * len(y)))
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    mean, std = x[train_idx].mean(), x[train_idx].std()
    idx = train_idx if split == "train" else val_idx
    return ArraySplit(images=(x[idx] - mean) / std, labels=y[idx], num_classes=10)


def array_batches(data: ArraySplit, batch_size: int, *, seed: int, shuffle: bool = True,
                  drop_remainder: bool = True) -> Iterator[Batch]:
    """Endless epochs over an in-memory split; a fresh seeded permutation per epoch."""
    if batch_size < 1 or (drop_remainder and batch_size > len(data)):
        raise ValueError(f"batch_size={batch_size}; allowed 1..{len(data)} for this split")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(data)) if shuffle else np.arange(len(data))
        stop = len(data) - (len(data) % batch_size if drop_remainder else 0)
        for i in range(0, stop, batch_size):
            idx = order[i:i + batch_size]
            yield {"image": data.images[idx], "label": data.labels[idx]}


# ----------------------------------------------------------------------------- ImageNet

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255.0
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32) * 255.0
_MANUAL_FILES = ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar")


def imagenet_missing_message(data_dir: str | None, manual_dir: str | None) -> str:
    """How to make `imagenet2012` available (it cannot be downloaded automatically)."""
    return (
        f"tfds dataset 'imagenet2012' is not prepared in data_dir={data_dir!r}"
        + (f" and manual_dir={manual_dir!r} lacks {' / '.join(_MANUAL_FILES)}" if manual_dir
           else "") + ".\n"
        "ImageNet needs a manual download. To prepare it once:\n"
        "  1. register at https://image-net.org/download-images and download "
        "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar into a folder MANUAL_DIR;\n"
        "  2. build the TFRecords (hours, ~150 GB):\n"
        "       tfds build imagenet2012 --data_dir=DATA_DIR --manual_dir=MANUAL_DIR\n"
        "     or run this binary with --config.data.manual_dir=MANUAL_DIR "
        "--config.data.prepare=True;\n"
        "  3. run with --config.data.data_dir=DATA_DIR.\n"
        "For a CPU-sized run of the same study use --config=configs/gradient_alignment/digits.py."
    )


def imagenet_builder(data_dir: str | None, manual_dir: str | None = None,
                     prepare: bool = False):
    """The tfds `imagenet2012` builder, with data checked (or built from `manual_dir`).

    Raises FileNotFoundError with preparation instructions when the data is absent and
    cannot (or may not: `prepare=False`) be built from `manual_dir`.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder("imagenet2012", data_dir=data_dir)
    try:
        builder.as_dataset(split="validation[:1]")  # cheap presence check (lazy dataset)
        return builder
    except Exception as e:  # tfds raises AssertionError / FileNotFoundError variants
        missing = e
    have_manual = manual_dir is not None and all(
        os.path.exists(os.path.join(manual_dir, f)) for f in _MANUAL_FILES)
    if prepare and have_manual:
        import tensorflow_datasets as tfds

        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
        return builder
    raise FileNotFoundError(imagenet_missing_message(data_dir, manual_dir)) from missing


def _random_resized_crop(image, size: int, seed, area=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """Inception-style crop (the torchvision RandomResizedCrop): a random box covering
    `area` of the image with aspect ratio in `ratio`, resized to `size` x `size`."""
    import tensorflow as tf

    shape = tf.shape(image)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
        seed=seed, min_object_covered=0.0, aspect_ratio_range=ratio, area_range=area,
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    crop = tf.slice(image, begin, crop_size)
    return tf.image.resize(crop, (size, size), method="bilinear", antialias=False)


def _center_crop(image, size: int, resize: int):
    import tensorflow as tf

    shape = tf.shape(image)
    h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    scale = resize / tf.minimum(h, w)
    nh, nw = tf.cast(tf.round(h * scale), tf.int32), tf.cast(tf.round(w * scale), tf.int32)
    image = tf.image.resize(image, (nh, nw), method="bilinear", antialias=True)
    top, left = (nh - size) // 2, (nw - size) // 2
    return image[top:top + size, left:left + size]


def imagenet_dataset(split: str, batch_size: int, *, train: bool, seed: int,
                     data_dir: str | None = None, manual_dir: str | None = None,
                     prepare: bool = False, image_size: int = 224,
                     shuffle_buffer: int = 10_000) -> Iterator[Batch]:
    """Endless (train) or one-pass (eval) batches of `imagenet2012` `split`.

    Train: shuffled, RandomResizedCrop(image_size) + random horizontal flip, stateless
    per-example seeds derived from `seed`. Eval: resize shorter side to 256/224*image_size
    and center-crop. Each JAX process reads its own slice of the split
    (`tfds.split_for_jax_process`), and `batch_size` is this process's batch.
    """
    import tensorflow as tf
    import tensorflow_datasets as tfds

    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}; must be >= 1")
    builder = imagenet_builder(data_dir, manual_dir, prepare)
    ds = builder.as_dataset(split=tfds.split_for_jax_process(split), shuffle_files=train,
                            read_config=tfds.ReadConfig(shuffle_seed=seed))
    mean, std = tf.constant(IMAGENET_MEAN), tf.constant(IMAGENET_STD)

    def prep(i, ex):
        image = tf.cast(ex["image"], tf.float32)
        if train:
            s = tf.random.experimental.stateless_split(tf.stack([seed, tf.cast(i, tf.int32)]), 2)
            image = _random_resized_crop(image, image_size, s[0])
            image = tf.image.stateless_random_flip_left_right(image, s[1])
        else:
            image = _center_crop(image, image_size, int(round(image_size * 256 / 224)))
        image = (tf.reshape(image, (image_size, image_size, 3)) - mean) / std
        return {"image": image, "label": tf.cast(ex["label"], tf.int32)}

    if train:
        ds = ds.repeat().shuffle(shuffle_buffer, seed=seed)
    ds = ds.enumerate().map(prep, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return iter(tfds.as_numpy(ds))
