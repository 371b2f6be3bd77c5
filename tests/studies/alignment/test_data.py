"""sera_jax.studies.alignment.data: the digits split and the tfds ImageNet pipeline (mock data)."""

import numpy as np
import pytest

from sera_jax.studies.alignment import data


def test_digits_split_is_deterministic_disjoint_and_standardised():
    tr, va = data.load_digits_split("train"), data.load_digits_split("val")
    assert len(tr) + len(va) == 1797 and len(va) == round(0.2 * 1797)
    assert tr.images.shape[1:] == (8, 8, 1) and tr.images.dtype == np.float32
    np.testing.assert_allclose([tr.images.mean(), tr.images.std()], [0, 1], atol=1e-4)
    again = data.load_digits_split("val")
    np.testing.assert_array_equal(va.images, again.images)
    other = data.load_digits_split("val", seed=1)
    assert not np.array_equal(va.labels, other.labels)
    # Disjoint: no val image appears in train.
    tr_rows = {r.tobytes() for r in tr.images.reshape(len(tr), -1)}
    dup = sum(r.tobytes() in tr_rows for r in va.images.reshape(len(va), -1))
    assert dup <= 2  # sklearn digits holds a couple of pixel-identical images
    with pytest.raises(ValueError, match="split"):
        data.load_digits_split("test")


def test_array_batches_epochs():
    va = data.load_digits_split("val")
    it = data.array_batches(va, 100, seed=0)
    seen = np.concatenate([next(it)["label"] for _ in range(3)])
    assert seen.shape == (300,)
    with pytest.raises(ValueError, match="batch_size"):
        next(data.array_batches(va, 10_000, seed=0))


def test_imagenet_absent_says_how_to_prepare(tmp_path):
    with pytest.raises(FileNotFoundError, match="tfds build imagenet2012"):
        data.imagenet_builder(str(tmp_path), manual_dir=str(tmp_path))


def test_imagenet_pipeline_on_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=8):
        tr = data.imagenet_dataset("train", 4, train=True, seed=0, data_dir=str(tmp_path),
                                   image_size=32, shuffle_buffer=8)
        b = next(tr)
        ev = next(data.imagenet_dataset("validation", 4, train=False, seed=0,
                                        data_dir=str(tmp_path), image_size=32))
    assert b["image"].shape == (4, 32, 32, 3) and b["image"].dtype == np.float32
    assert b["label"].dtype == np.int32 and ev["image"].shape == (4, 32, 32, 3)
    assert np.all((b["label"] >= 0) & (b["label"] < 1000))
    assert abs(float(ev["image"].mean())) < 3  # normalised by ImageNet mean/std
