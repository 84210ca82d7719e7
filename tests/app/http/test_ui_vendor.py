"""The UI's vendored modules are exactly the files of the npm packages pinned in tests/js."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import npm as npm_clients
from tests.support.npm import NODE_MODULES

ROOT = Path(__file__).resolve().parents[3]
VENDOR = ROOT / "app" / "http" / "ui" / "vendor"

# vendored file → (package, file inside the package)
FILES = {
    "marked/marked.esm.js": ("marked", "lib/marked.esm.js"),
    "dompurify/purify.es.mjs": ("dompurify", "dist/purify.es.mjs"),
    "highlight/highlight.min.js": ("@highlightjs/cdn-assets", "es/highlight.min.js"),
}


def test_every_vendored_module_has_its_licence() -> None:
    for name in FILES:
        assert (VENDOR / name).parent.joinpath("LICENSE").is_file(), name


def test_vendored_modules_are_the_pinned_packages_files() -> None:
    npm_clients.node()  # installs the pinned packages if they are not
    pinned = json.loads((ROOT / "tests" / "js" / "package.json").read_text())["dependencies"]
    readme = (VENDOR / "README.md").read_text()
    for name, (package, inside) in FILES.items():
        shipped = (NODE_MODULES / package / inside).read_bytes()
        assert (VENDOR / name).read_bytes() == shipped, f"{name} differs from {package}"
        installed = json.loads((NODE_MODULES / package / "package.json").read_text())
        assert installed["version"] == pinned[package]
        assert f"| {pinned[package]} |" in readme, f"the README names another {package} version"
