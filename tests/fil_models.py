"""Tree models trained by the frameworks themselves (XGBoost, LightGBM, scikit-learn through
Treelite) on synthetic data, written as `backend: "fil"` models of a Triton repository, with the
frameworks' own predictions for the rows the tests send (no committed binaries, except the
XGBoost legacy-binary model that XGBoost 3 cannot write: tests/data/fil/)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "fil"
FEATURES = 8


@dataclass
class FilCase:
    name: str
    rows: np.ndarray  # FP32 [n, features], NaN = missing
    expected: np.ndarray  # what output__0 must be (the framework's own prediction)
    features: int = FEATURES


def _data(seed: int, classes: int = 2, rows: int = 600, missing: bool = True):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    score = X[:, 0] + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    if classes == 0:  # regression, values of order 1
        y = score + 0.1 * rng.standard_normal(rows)
    else:
        y = np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))
    if missing:
        X[rng.random(X.shape) < 0.05] = np.nan
    test = rng.standard_normal((40, FEATURES)).astype(np.float32)
    if missing:
        test[rng.random(test.shape) < 0.1] = np.nan
        test[0, :] = np.nan  # a row with every feature missing
    return X, y, test


def write_model(repo: Path, name: str, model_file: str, parameters: dict[str, str], *, out_dims: list[int],
                features: int = FEATURES, max_batch_size: int = 64, extra: str = "",
                batching: str = "dynamic_batching { }") -> Path:
    params = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items())
    text = f"""
        backend: "fil"
        max_batch_size: {max_batch_size}
        input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]
        output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {", ".join(map(str, out_dims))} ] }} ]
        {batching}
        {extra}
    """
    path = repo / name / "config.pbtxt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip() + "parameters [\n" + params + "\n]\n")
    return repo / name / "1" / model_file


def xgboost_models(repo: Path) -> list[FilCase]:
    import xgboost

    cases = []
    X, y, test = _data(1, classes=3)
    clf = xgboost.XGBClassifier(n_estimators=20, max_depth=4, n_jobs=1).fit(X, y)
    target = write_model(repo, "xgb_multiclass", "xgboost.json",
                         {"model_type": "xgboost_json", "is_classifier": "true", "predict_proba": "true",
                          "threshold": "0.5"}, out_dims=[3])
    target.parent.mkdir(parents=True)
    clf.save_model(target)
    cases.append(FilCase("xgb_multiclass", test, clf.predict_proba(test)))
    write_model(repo, "xgb_multiclass_class", "xgboost.json",
                {"model_type": "xgboost_json", "is_classifier": "true", "threshold": "0.5"}, out_dims=[1])
    (repo / "xgb_multiclass_class" / "1").mkdir(parents=True)
    clf.save_model(repo / "xgb_multiclass_class" / "1" / "xgboost.json")
    cases.append(FilCase("xgb_multiclass_class", test, clf.predict(test).astype(np.float32)))

    X, y, test = _data(2)
    binary = xgboost.XGBClassifier(n_estimators=25, max_depth=4, n_jobs=1).fit(X, y)
    for name, params, dims, expected in [
        ("xgb_binary_pair", {"predict_proba": "true"}, [2], binary.predict_proba(test)),
        ("xgb_binary_positive", {"predict_proba": "true"}, [1], binary.predict_proba(test)[:, 1]),
        ("xgb_binary_threshold", {"threshold": "0.3"}, [1], (binary.predict_proba(test)[:, 1] > 0.3).astype(np.float32)),
    ]:
        target = write_model(repo, name, "xgboost.ubj",
                             {"model_type": "xgboost_ubj", "is_classifier": "true", "threshold": "0.5", **params},
                             out_dims=dims)
        target.parent.mkdir(parents=True)
        binary.save_model(target)
        cases.append(FilCase(name, test, expected))

    X, y, test = _data(3, classes=0)
    reg = xgboost.XGBRegressor(n_estimators=30, max_depth=5, n_jobs=1).fit(X, y)
    # with a warmup sample: the model is ready only once it ran (a failed warmup fails the load)
    warmup = ('model_warmup [ { name: "rows" batch_size: 4 inputs { key: "input__0" value: '
              '{ data_type: TYPE_FP32 dims: [ 8 ] random_data: true } } } ]')
    target = write_model(repo, "xgb_regressor", "model.json",
                         {"model_type": "xgboost_json", "is_classifier": "false"}, out_dims=[1], extra=warmup)
    target.parent.mkdir(parents=True)
    reg.save_model(target)
    (repo / "xgb_regressor" / "config.pbtxt").write_text(
        (repo / "xgb_regressor" / "config.pbtxt").read_text() + 'default_model_filename: "model.json"\n'
    )
    cases.append(FilCase("xgb_regressor", test, reg.predict(test)))
    return cases


def lightgbm_models(repo: Path) -> list[FilCase]:
    import lightgbm

    cases = []
    X, y, test = _data(4, classes=3)
    clf = lightgbm.LGBMClassifier(n_estimators=20, num_leaves=15, verbose=-1, n_jobs=1).fit(X, y)
    target = write_model(repo, "lgb_multiclass", "model.txt",
                         {"model_type": "lightgbm", "is_classifier": "true", "predict_proba": "true",
                          "threshold": "0.5"}, out_dims=[3], extra="instance_group [ { count: 2 kind: KIND_CPU } ]",
                         # a 20 ms queue delay: concurrent one-row requests wait for each other and batch
                         # (with none, a request that finds an instance free runs at once, alone, as in Triton)
                         batching="dynamic_batching { max_queue_delay_microseconds: 20000 }")
    target.parent.mkdir(parents=True)
    clf.booster_.save_model(target)
    cases.append(FilCase("lgb_multiclass", test, clf.predict_proba(test)))

    X, y, test = _data(5)
    binary = lightgbm.LGBMClassifier(n_estimators=20, num_leaves=15, verbose=-1, n_jobs=1).fit(X, y)
    # tritonserver 2.51's name of is_classifier
    target = write_model(repo, "lgb_binary_output_class", "model.txt",
                         {"model_type": "lightgbm", "output_class": "true", "threshold": "0.5"}, out_dims=[1])
    target.parent.mkdir(parents=True)
    binary.booster_.save_model(target)
    cases.append(FilCase("lgb_binary_output_class", test, binary.predict(test).astype(np.float32)))

    X, y, test = _data(6, classes=0)
    reg = lightgbm.LGBMRegressor(n_estimators=30, num_leaves=15, verbose=-1, n_jobs=1).fit(X, y)
    target = write_model(repo, "lgb_regressor", "model.txt",
                         {"model_type": "lightgbm", "is_classifier": "false"}, out_dims=[1])
    target.parent.mkdir(parents=True)
    reg.booster_.save_model(target)
    cases.append(FilCase("lgb_regressor", test, reg.predict(test)))
    return cases


def sklearn_models(repo: Path) -> list[FilCase]:
    """scikit-learn forests converted to Treelite checkpoints, as FIL's docs do."""
    import treelite.sklearn
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier

    cases = []
    X, y, test = _data(7, classes=3, missing=False)
    forest = RandomForestClassifier(n_estimators=15, max_depth=6, random_state=0).fit(X, y)
    target = write_model(repo, "sk_forest", "checkpoint.tl",
                         {"model_type": "treelite_checkpoint", "is_classifier": "true", "predict_proba": "true",
                          "threshold": "0.5"}, out_dims=[3])
    target.parent.mkdir(parents=True)
    treelite.sklearn.import_model(forest).serialize(str(target))
    cases.append(FilCase("sk_forest", test, forest.predict_proba(test)))

    X, y, test = _data(8, classes=0, missing=False)
    boosting = GradientBoostingRegressor(n_estimators=25, max_depth=3, random_state=0).fit(X, y)
    target = write_model(repo, "sk_boosting", "checkpoint.tl",
                         {"model_type": "treelite_checkpoint", "is_classifier": "false"}, out_dims=[1])
    target.parent.mkdir(parents=True)
    treelite.sklearn.import_model(boosting).serialize(str(target))
    cases.append(FilCase("sk_boosting", test, boosting.predict(test)))
    return cases


def legacy_model(repo: Path) -> FilCase:
    """XGBoost's legacy binary format (model_type "xgboost", the FIL default), made by XGBoost 2."""
    data = json.loads((DATA / "xgboost_legacy.json").read_text())
    rows = np.array([[np.nan if v is None else v for v in row] for row in data["rows"]], dtype=np.float32)
    target = write_model(repo, "xgb_legacy", "xgboost.model",
                         {"is_classifier": "true", "predict_proba": "true", "threshold": "0.5"},
                         out_dims=[1], features=rows.shape[1])
    target.parent.mkdir(parents=True)
    target.write_bytes((DATA / "xgboost_legacy.model").read_bytes())
    return FilCase("xgb_legacy", rows, np.array(data["predict_proba"], dtype=np.float32), features=rows.shape[1])


def all_models(repo: Path) -> dict[str, FilCase]:
    cases = [*xgboost_models(repo), *lightgbm_models(repo), *sklearn_models(repo), legacy_model(repo)]
    return {case.name: case for case in cases}


def assert_matches(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    """Equal within float32 rounding (accumulated over the trees): FIL computes in float32."""
    expected = np.asarray(expected, dtype=np.float64).reshape(got.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6, err_msg=name)
