"""Makes xgboost_legacy.model and xgboost_legacy.json: an XGBoost model in XGBoost's legacy
binary format (FIL's model_type "xgboost") and rows with XGBoost's own predictions for them.

XGBoost 3 neither writes nor reads that format, so the test suite cannot train one itself; this
script was run once with XGBoost 2.1.4 (the last line that writes it) and its outputs are kept:

    python -m venv /tmp/xgb2 && /tmp/xgb2/bin/pip install xgboost-cpu==2.1.4 numpy
    /tmp/xgb2/bin/python tests/data/fil/make_xgboost_legacy.py
"""

import json
from pathlib import Path

import numpy as np
import xgboost

HERE = Path(__file__).resolve().parent

rng = np.random.default_rng(7)
X = rng.standard_normal((400, 6)).astype(np.float32)
X[rng.random(X.shape) < 0.05] = np.nan  # missing values
y = ((np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * np.nan_to_num(X[:, 2])) > 0).astype(int)
booster = xgboost.train({"objective": "binary:logistic", "max_depth": 4, "nthread": 1}, xgboost.DMatrix(X, label=y), 12)
(HERE / "xgboost_legacy.model").write_bytes(booster.save_raw("deprecated"))
rows = X[:32]
probabilities = booster.predict(xgboost.DMatrix(rows))
(HERE / "xgboost_legacy.json").write_text(json.dumps({
    "xgboost_version": xgboost.__version__,
    "rows": [[None if np.isnan(v) else float(v) for v in row] for row in rows],
    "predict_proba": [float(p) for p in probabilities],
}, indent=1) + "\n")
