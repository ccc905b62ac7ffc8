"""bench/servers.py's --frontends values: the per-backend benches (pytorch, fil, openvino) name
each arm's front end, optionally with environment for its server (`NAME+VAR=VALUE`), so that arms
differing only in a setting are measured interleaved in one run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import servers  # noqa: E402


def test_a_front_end_with_settings_is_its_own_arm_with_that_environment() -> None:
    plain, tuned = servers.frontends("http-uvicorn,http-uvicorn+TOOLKIT_INSTANCE_NICE=0+TOOLKIT_WORKERS=2")
    assert plain == servers.FRONTENDS["http-uvicorn"]
    assert plain.env() == {"TOOLKIT_HTTP_FRONTEND": "uvicorn"}
    assert tuned.name == "http-uvicorn+TOOLKIT_INSTANCE_NICE=0+TOOLKIT_WORKERS=2"
    assert tuned.protocol == "http"
    assert tuned.env() == {"TOOLKIT_HTTP_FRONTEND": "uvicorn", "TOOLKIT_INSTANCE_NICE": "0", "TOOLKIT_WORKERS": "2"}
    assert tuned.as_dict()["env"]["TOOLKIT_WORKERS"] == "2"
    # a setting may also override the front end's own variable; an empty value is a value
    (empty,) = servers.frontends("http-uvicorn+TOOLKIT_HTTP_FRONTEND=")
    assert empty.env() == {"TOOLKIT_HTTP_FRONTEND": ""}


@pytest.mark.parametrize(("spec", "message"), [
    ("http-hyper", "unknown 'http-hyper'"),
    ("http-uvicorn+TOOLKIT_WORKERS", "'TOOLKIT_WORKERS' is not VARIABLE=VALUE"),
    ("http-uvicorn+=2", "'=2' is not VARIABLE=VALUE"),
])
def test_a_wrong_front_end_or_setting_is_refused_by_name(spec: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        servers.frontends(spec)
