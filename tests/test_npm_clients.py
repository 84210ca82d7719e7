"""The tests' npm packages install themselves once per test run (``tests.support.npm``).

Each case runs ``NpmPackages.prepare`` in four processes at once, as four pytest-xdist workers
would, against a package directory of its own and stand-ins for ``node`` and ``npm`` (shell
scripts on ``PATH``): the stand-in npm counts its calls, takes a while, then installs or fails.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.npm import NODE_REQUIRED

ROOT = Path(__file__).resolve().parents[1]
# the stand-ins run with only their own directory on PATH
SLEEP = shutil.which("sleep")
MKDIR = shutil.which("mkdir")

PACKAGE = {"name": "t", "engines": {"node": ">=22.12"}, "dependencies": {"left-pad": "1.3.0"}}

# what npm ci leaves: the package at its version, then the hidden lock file
INSTALLS = f"""#!/bin/sh
echo "$*" >> "$CALLS"
{SLEEP} 0.5
{MKDIR} -p "$PACKAGES/node_modules/left-pad"
echo '{{"version": "1.3.0"}}' > "$PACKAGES/node_modules/left-pad/package.json"
echo '{{}}' > "$PACKAGES/node_modules/.package-lock.json"
"""
FAILS = f"""#!/bin/sh
echo "$*" >> "$CALLS"
{SLEEP} 0.5
echo "npm error 404 Not Found - GET left-pad" >&2
exit 1
"""
PREPARE = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from tests.support.npm import NpmPackages\n"
    "packages = NpmPackages(Path(sys.argv[1]), lock=Path(sys.argv[2]))\n"
    "print(json.dumps(packages.prepare()))\n"
)


def _tools(tmp_path: Path, npm: str | None, node: bool = True) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("node", "#!/bin/sh\n" if node else None), ("npm", npm)):
        if script is not None:
            (bin_dir / name).write_text(script, encoding="utf-8")
            (bin_dir / name).chmod(0o755)
    return bin_dir


def _prepare_in_workers(tmp_path: Path, bin_dir: Path, workers: int = 4) -> list[list[str]]:
    """``prepare()`` in ``workers`` processes of one test run, started together."""
    packages = tmp_path / "js"
    packages.mkdir(exist_ok=True)
    (packages / "package.json").write_text(json.dumps(PACKAGE), encoding="utf-8")
    env = {
        "PATH": str(bin_dir),
        "CALLS": str(tmp_path / "calls"),
        "PACKAGES": str(packages),
        "PYTEST_XDIST_TESTRUNUID": "run-1",
    }
    started = [
        subprocess.Popen(
            [sys.executable, "-c", PREPARE, str(packages), str(tmp_path / "lock")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    outcomes = []
    for process in started:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        outcomes.append(json.loads(out))
    return outcomes


def _npm_calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "calls"
    return calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []


def test_the_first_worker_installs_and_the_others_find_the_packages(tmp_path: Path) -> None:
    bin_dir = _tools(tmp_path, npm=INSTALLS)
    outcomes = _prepare_in_workers(tmp_path, bin_dir)
    assert outcomes == [["ready", str(bin_dir / "node")]] * 4
    assert len(_npm_calls(tmp_path)) == 1
    assert _npm_calls(tmp_path)[0].startswith(f"ci --prefix {tmp_path / 'js'} ")
    # installed: a later run finds them without npm
    (bin_dir / "npm").unlink()
    assert _prepare_in_workers(tmp_path, bin_dir, workers=1) == [["ready", str(bin_dir / "node")]]


def test_a_failed_install_fails_every_worker_with_npms_words_once(tmp_path: Path) -> None:
    outcomes = _prepare_in_workers(tmp_path, _tools(tmp_path, npm=FAILS))
    assert len(_npm_calls(tmp_path)) == 1
    for verdict, detail in outcomes:
        assert verdict == "fail"
        assert "failed (exit status 1)" in detail
        assert "left-pad@1.3.0" in detail
        assert "404 Not Found" in detail


def test_an_install_cut_short_is_installed_again(tmp_path: Path) -> None:
    packages = tmp_path / "js"
    (packages / "node_modules" / "left-pad").mkdir(parents=True)
    (packages / "node_modules" / "left-pad" / "package.json").write_text('{"version": "1.3.0"}')
    # no node_modules/.package-lock.json: npm did not finish
    outcomes = _prepare_in_workers(tmp_path, _tools(tmp_path, npm=INSTALLS), workers=2)
    assert [verdict for verdict, _ in outcomes] == ["ready", "ready"]
    assert len(_npm_calls(tmp_path)) == 1


def test_without_node_the_test_is_skipped_naming_it(tmp_path: Path) -> None:
    outcomes = _prepare_in_workers(tmp_path, _tools(tmp_path, npm=INSTALLS, node=False), 1)
    [(verdict, detail)] = outcomes
    assert verdict == "skip"
    assert detail.startswith("Node.js is not installed")
    assert "Node >=22.12 and npm" in detail
    assert _npm_calls(tmp_path) == []


def test_without_npm_missing_packages_are_a_skip_naming_the_command(tmp_path: Path) -> None:
    [(verdict, detail)] = _prepare_in_workers(tmp_path, _tools(tmp_path, npm=None), 1)
    assert verdict == "skip"
    assert detail.startswith("npm is not installed")
    assert f"npm ci --prefix {tmp_path / 'js'}" in detail
    assert "left-pad@1.3.0" in detail


def test_the_docs_state_the_node_version_the_packages_declare() -> None:
    wanted = re.fullmatch(r">=(\d+(?:\.\d+)?)", NODE_REQUIRED)
    assert wanted is not None, NODE_REQUIRED
    development = (ROOT / "README.md").read_text(encoding="utf-8").split("## Development")[1]
    assert f"Node {wanted[1]} or later" in development
