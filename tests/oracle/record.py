"""Record real tritonserver's verdicts on the oracle corpus into expected.json.

    cd tests && ../.venv/bin/python -m oracle.record            # every group, both modes
    cd tests && ../.venv/bin/python -m oracle.record core onnx  # some groups (others are kept)

Each group of tests/oracle/corpus is materialized (materialize.py) into a temporary repository
and loaded by `scripts/tools/tritonserver validate` (the real tritonserver 2.51.0, installed on
first use; docs/tools.md) twice: with `--strict-model-config=true` ("strict": like
`toolkit validate --disable-auto-complete-config`) and with `--autofill` ("autofill": auto-complete
enabled, toolkit's default). Groups whose
ORACLE.json says {"isolate": true} load each model in a repository of its own (tritonserver 2.51
sometimes crashes when many python models run their warmup at once); there a model that alone
makes tritonserver abort or hang is recorded with the state "CRASH" ({"together": [[...]]}
lists models that are loaded together, e.g. ensembles and the models they use).

For every model the file records tritonserver's state, the versions it loaded and its reason,
exactly as tritonserver gives them, except that the temporary repository path is replaced by
"$REPO". For groups that are not isolated it also records the completed config tritonserver
serves (GET /v2/models/<model>/config) for every READY model (`validate --configs`, same run).
Reasons that the repository index does not carry (ensemble dependency errors, models with no
version to load) are taken from tritonserver's log, where the model is named.

The expected values are never edited by hand: rerun this script.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .materialize import groups, group_options, materialize, models

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected.json"
TRITONSERVER = HERE.parents[1] / "scripts" / "tools" / "tritonserver"
MODES = {"strict": [], "autofill": ["--autofill"]}
REPO = "$REPO"

# Log lines that carry a model's reason when the repository index has none.
_FAILED_LOAD = re.compile(r"""failed to load model '([^']+)': (.*?)"?$""")
_DEPENDENCY = re.compile(r"""model_repository_manager\.cc:\d+\] "(Invalid argument: .*?)"?$""")
_DEPENDENCY_SUBJECT = [
    re.compile(r"^Invalid argument: ensemble (\S+) contains models that are not available"),
    re.compile(r"^Invalid argument: circular dependency between ensembles: (\S+) -> "),
    re.compile(r"^Invalid argument: in ensemble (\S+?), "),
    re.compile(r"^Invalid argument: ensemble '([^']+)' depends on "),
    re.compile(r"^Invalid argument: ensemble (\S+) allows maximum batch size "),
]


class OracleError(RuntimeError):
    pass


def run_oracle(repository: Path, mode: str, timeout: float, attempts: int = 2) -> dict:
    """`scripts/tools/tritonserver validate --json --configs --log` on `repository`: the
    repository index ("models"), the configs READY models serve ("configs") and tritonserver's log.

    A model that hangs tritonserver's startup makes the tool give up after `timeout` seconds (it
    stops its tritonserver and cleans up). A server that dies without a word is tried again (up to
    `attempts` runs); an abort with a C++ exception or a hang is final.
    """
    problem = ""
    for _ in range(attempts):
        proc = subprocess.run(
            [str(TRITONSERVER), "validate", str(repository), "--json", "--configs", "--log",
             "--timeout", str(timeout), *MODES[mode]],
            capture_output=True,
            text=True,
            timeout=timeout + 900,  # the first use installs the tool
        )
        try:
            result = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise OracleError(f"scripts/tools/tritonserver failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        failure = result.get("failure")
        if failure is None:
            return result
        if failure["kind"] == "hung":
            problem = f"tritonserver did not come up within {timeout:.0f} s (it hangs)"
            break  # a hang is not worth waiting for again
        problem = failure["message"].replace("terminate called after throwing an instance of", "tritonserver aborted:")
        if failure["message"].startswith("terminate called"):
            break  # a crash is deterministic: no need to try again
        problem = "tritonserver did not come up"
    raise OracleError(problem)


_CIRCULAR = "Invalid argument: circular dependency between ensembles: "


def _from_log(log: str) -> tuple[dict[str, str], list[str]]:
    """Reasons the log names a model in, and the circular-dependency lines (which do not say
    which model they belong to: Triton gives every node of a cycle one of the cycle's messages)."""
    reasons: dict[str, str] = {}
    circular: list[str] = []
    for line in log.splitlines():
        match = _FAILED_LOAD.search(line)
        if match:
            reasons.setdefault(match.group(1), match.group(2))
            continue
        match = _DEPENDENCY.search(line)
        if match:
            text = match.group(1)
            if text.startswith(_CIRCULAR):
                circular.append(text)
                continue
            for pattern in _DEPENDENCY_SUBJECT:
                subject = pattern.match(text)
                if subject:
                    reasons.setdefault(subject.group(1).strip("'"), text)
                    break
    return reasons, circular


def verdicts(index: list[dict], log: str, names: list[str], root: Path) -> tuple[dict[str, dict], list[str]]:
    """tritonserver's outcome for each model directory in `names`, and its circular-dependency
    messages (see `_from_log`)."""
    from_log, circular = _from_log(log)
    out: dict[str, dict] = {}
    for name in names:
        entries = [e for e in index if e.get("name") == name]
        with_state = [e for e in entries if e.get("state")]
        if with_state:
            ready = [int(e["version"]) for e in with_state if e["state"] == "READY" and e.get("version")]
            failed = [e for e in with_state if e["state"] != "READY"]
            record = {
                "state": failed[0]["state"] if failed else "READY",
                "versions": sorted(ready),
                "reason": failed[0].get("reason", "") if failed else "",
            }
            if len(with_state) > 1:
                record["entries"] = [
                    {"version": e.get("version"), "state": e["state"], "reason": e.get("reason", "")}
                    for e in sorted(with_state, key=lambda e: int(e.get("version") or 0))
                ]
        elif name in from_log:
            record = {"state": "UNAVAILABLE", "versions": [], "reason": from_log[name]}
        elif circular:
            record = {"state": "UNAVAILABLE", "versions": [], "reason": None, "circular": True}
        else:
            record = {"state": "UNKNOWN", "versions": [], "reason": ""}
        out[name] = json.loads(json.dumps(record).replace(str(root), REPO))
    return out, circular


def record_group(group: str) -> dict[str, dict]:
    isolate = group_options(group).get("isolate", False)
    names = models(group)
    result: dict[str, dict] = {}
    for mode in MODES:
        found: dict[str, dict] = {}
        circular: list[str] = []
        together = [list(t) for t in group_options(group).get("together", [])]
        grouped = {n for t in together for n in t}
        batches = together + [[n] for n in names if n not in grouped] if isolate else [names]
        for batch in batches:
            with tempfile.TemporaryDirectory(prefix=f"oracle-{group}-") as tmp:
                root = Path(tmp).resolve() / "models"
                materialize(group, root, only=batch)
                try:
                    # tritonserver 2.51 sometimes dies when a warmup fails: try again before
                    # recording a crash.
                    run = run_oracle(root, mode, timeout=60, attempts=3) if isolate else run_oracle(
                        root, mode, timeout=240
                    )
                except OracleError as exc:
                    if not isolate:
                        raise
                    # The model alone (or with the models it needs) crashes or hangs
                    # tritonserver: that is the verdict.
                    for name in batch:
                        found[name] = {"state": "CRASH", "versions": [], "reason": str(exc)}
                    continue
                verdict, lines = verdicts(run["models"], run["log"], batch, root)
                found.update(verdict)
                circular.extend(lines)
                if not isolate:
                    configs = json.loads(json.dumps(run["configs"]).replace(str(root), REPO))
        result[mode] = {"models": found, "circular": sorted(circular)}
        if not isolate:
            result[mode]["configs"] = configs
        summary = ", ".join(f"{n}={v['state']}" for n, v in sorted(found.items()))
        print(f"{group} {mode}: {summary}", file=sys.stderr)
    return result


def tritonserver_version() -> str:
    return "2.51.0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help="corpus groups to record (default: all)")
    args = parser.parse_args(argv)
    wanted = args.groups or groups()
    unknown = set(wanted) - set(groups())
    if unknown:
        parser.error(f"unknown group(s): {', '.join(sorted(unknown))}")

    data = json.loads(EXPECTED.read_text()) if EXPECTED.is_file() else {}
    data["oracle"] = f"tritonserver {tritonserver_version()} via scripts/tools/tritonserver validate (--exit-on-error=false)"
    data.setdefault("groups", {})
    for group in list(data["groups"]):
        if group not in groups():
            del data["groups"][group]
    for group in wanted:
        data["groups"][group] = record_group(group)
        EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {EXPECTED} ({group})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
