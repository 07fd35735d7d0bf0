"""Estimator files: a fitted estimator saved and loaded as plain data, predicting the same.

``xrfm_torch.save_model`` / ``load_model`` take a fitted ``XRFMClassifier`` / ``XRFMRegressor``
(whatever model it holds) with its column encoding; crafted files are refused with no side
effect, as model files are (test_untrusted_files.py).
"""

from __future__ import annotations

import io
import pickle
import zipfile

import numpy as np
import pandas as pd
import pytest
import torch

from xrfm_torch import XRFMClassifier, XRFMRegressor, load_model, save_model
from xrfm_torch.models import io as model_io


def mixed_table(n: int = 240, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Numbers, text categories and missing cells; string labels and a numeric target."""
    rng = np.random.default_rng(seed)
    colour = rng.choice(["red", "green", "blue"], n).astype(object)
    size = rng.normal(size=n)
    count = rng.integers(0, 5, n).astype(float)
    colour[rng.random(n) < 0.1] = None
    size[rng.random(n) < 0.1] = np.nan
    df = pd.DataFrame({"colour": colour, "size": size, "count": count, "flag": rng.random(n) > 0.5})
    score = np.nan_to_num(size) + (df["colour"] == "red") * 1.5 + 0.3 * count
    labels = np.where(score > np.median(score), "high", "low")
    return df, labels, score.to_numpy(dtype=float)


FAST = {"n_iters": 1, "max_leaf_size": 120, "random_state": 0}


@pytest.fixture(scope="module")
def classifier():
    df, labels, _ = mixed_table()
    return XRFMClassifier(**FAST).fit(df, labels), df


@pytest.fixture(scope="module")
def regressor():
    df, _, target = mixed_table(seed=1)
    return XRFMRegressor(**FAST).fit(df, target), df


def test_a_classifier_file_predicts_the_dataframe_bit_for_bit(classifier, tmp_path):
    est, df = classifier
    path = tmp_path / "clf.pt"
    save_model(est, path)
    raw = torch.load(path, weights_only=True)  # plain data: nothing is unpickled as code
    assert raw["format"] == "xrfm_torch.estimator" and raw["estimator"] == "XRFMClassifier"
    loaded = load_model(path)
    assert isinstance(loaded, XRFMClassifier) and loaded.get_params() == est.get_params()
    assert np.array_equal(loaded.predict_proba(df), est.predict_proba(df))
    assert loaded.predict(df).tolist() == est.predict(df).tolist()
    assert loaded.classes_.dtype == est.classes_.dtype and list(loaded.classes_) == ["high", "low"]
    assert list(loaded.feature_names_in_) == ["colour", "size", "count", "flag"]
    # columns by name, in another order, and a category never seen reads as none of the levels
    shuffled = df[["flag", "count", "size", "colour"]].copy()
    shuffled.loc[0, "colour"] = "purple"
    assert np.array_equal(loaded.predict_proba(shuffled), est.predict_proba(shuffled))
    with pytest.raises(ValueError, match="lacks columns.*'size'"):
        loaded.predict(df.drop(columns="size"))


def test_a_regressor_file_and_an_anytime_choice_round_trip(regressor, tmp_path):
    est, df = regressor
    save_model(est, tmp_path / "reg.pt")
    loaded = load_model(tmp_path / "reg.pt")
    assert isinstance(loaded, XRFMRegressor)
    assert np.array_equal(loaded.predict(df), est.predict(df))
    _, _, target = mixed_table(seed=1)
    timed = XRFMRegressor(**FAST, time_limit=30.0).fit(df, target)
    save_model(timed, tmp_path / "timed.pt")
    again = load_model(tmp_path / "timed.pt")
    assert again.model_.summary()["chosen"] == timed.model_.summary()["chosen"]
    assert torch.equal(
        again.model_.trials_[:, 0].nan_to_num(), timed.model_.trials_[:, 0].nan_to_num()
    )
    assert np.array_equal(again.predict(df), timed.predict(df))


def test_the_pickle_round_trip_keeps_working(classifier):
    est, df = classifier
    again = pickle.loads(pickle.dumps(est))
    assert np.array_equal(again.predict_proba(df), est.predict_proba(df))


def test_unfitted_and_unsaveable_estimators_are_refused_by_name(tmp_path):
    with pytest.raises(RuntimeError, match="XRFMClassifier is not fitted"):
        save_model(XRFMClassifier(), tmp_path / "x.pt")
    with pytest.raises(TypeError, match="got list"):
        save_model([1, 2], tmp_path / "x.pt")
    df, labels, _ = mixed_table(80)
    odd = XRFMClassifier(**FAST, class_weight={"high": 1.0, "low": 2.0}).fit(df, labels)
    odd.class_weight = {"high": object()}  # as if set after the fit
    with pytest.raises(ValueError, match="parameter 'class_weight' holds a object"):
        save_model(odd, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_the_core_reader_names_the_estimator_file(classifier, tmp_path):
    save_model(classifier[0], tmp_path / "clf.pt")
    with pytest.raises(ValueError, match="scikit-learn estimator.*xrfm_torch.load_model"):
        model_io.load_model(tmp_path / "clf.pt")


# ---- crafted files -----------------------------------------------------------------------------
def _crafted(est, tmp_path, change) -> str:
    path = tmp_path / "est.pt"
    save_model(est, path)
    raw = torch.load(path, weights_only=True)
    change(raw)
    torch.save(raw, path)
    return str(path)


def evil(victim) -> dict:
    return {"_target_": "builtins.open", "file": str(victim), "mode": "w"}


@pytest.mark.parametrize("place", ["estimator", "kernel", "model", "leaf"])
def test_a_target_outside_the_allow_list_is_refused_with_no_side_effect(regressor, tmp_path, place):
    victim = tmp_path / "written_by_the_file"

    def change(raw):
        if place == "estimator":
            raw["estimator"] = "builtins.open"
        elif place == "kernel":
            raw["params"]["kernel"] = evil(victim)
        elif place == "model":
            raw["model"]["config"] = {**evil(victim), "x": raw["model"]["config"]}
        else:
            raw["model"]["config"]["leaf"] = evil(victim)

    path = _crafted(regressor[0], tmp_path, change)
    with pytest.raises(ValueError, match=r"builtins\.open"):
        load_model(path)
    assert not victim.exists()


class _Payload:
    def __init__(self, victim) -> None:
        self.victim = str(victim)

    def __reduce__(self):
        return (open, (self.victim, "w"))


def test_a_pickled_payload_is_refused_with_no_side_effect(regressor, tmp_path):
    victim = tmp_path / "written_by_the_file"
    path = _crafted(regressor[0], tmp_path, lambda raw: None)
    raw = torch.load(path, weights_only=True)
    raw["params"]["verbose"] = _Payload(victim)
    torch.save(raw, path)  # a full pickle: loading it would call open(victim, "w")
    assert not victim.exists()
    with pytest.raises(ValueError, match="not a readable xrfm_torch model file"):
        load_model(path)
    assert not victim.exists()


def test_an_oversized_array_claim_is_refused(regressor, tmp_path):
    """A tensor whose recorded shape claims far more than its stored bytes."""
    path = tmp_path / "est.pt"
    raw = torch.load(_crafted(regressor[0], tmp_path, lambda raw: None), weights_only=True)
    raw["model"]["state_dict"]["probe"] = torch.zeros(77777)
    torch.save(raw, path)
    data = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(data, "w") as dst:
        for item in src.infolist():
            blob = src.read(item.filename)
            if item.filename.endswith("data.pkl"):
                # the storage's record keeps its true length; the shape after it lies
                old = (77777).to_bytes(4, "little")
                at = blob.rindex(old)
                assert blob.count(old) == 2 and at > blob.index(old)
                blob = blob[:at] + (2**31 - 1).to_bytes(4, "little") + blob[at + 4 :]
            dst.writestr(item, blob)
    path.write_bytes(data.getvalue())
    with pytest.raises(ValueError, match="not a readable xrfm_torch model file"):
        load_model(path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("n_features_in_", 10**12, "feature_names_in_ must list 1000000000000 names"),
        ("categorical", [0, 99], "categorical must be distinct indices"),
        ("feature_names_in_", ["a"], "feature_names_in_ must list 4 names"),
        ("classes", ["only"], "class labels must be a list of >= 2"),
    ],
)
def test_fitted_attributes_that_disagree_are_refused_by_name(
    classifier, tmp_path, key, value, message
):
    path = _crafted(classifier[0], tmp_path, lambda raw: raw["fitted"].__setitem__(key, value))
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_unknown_params_and_newer_versions_are_refused(regressor, tmp_path):
    path = _crafted(regressor[0], tmp_path, lambda raw: raw["params"].__setitem__("evil", 1))
    with pytest.raises(ValueError, match="does not take these params"):
        load_model(path)
    path = _crafted(regressor[0], tmp_path, lambda raw: raw.__setitem__("format_version", 99))
    with pytest.raises(ValueError, match="estimator format version 99"):
        load_model(path)
