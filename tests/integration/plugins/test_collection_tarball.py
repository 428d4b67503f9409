"""The collection as users install it (issue 21, item 1).

Builds the tarball with ``ansible-galaxy collection build`` from a copy of this checkout into which every
generated or cache path is planted (each ``.gitignore`` entry plus the tool state ``.gitignore`` does not
list), checks the tarball's file list against an allowlist, installs it with ``ansible-galaxy collection
install`` into a temporary collections path and, from there only, runs ``ansible-playbook --syntax-check``
on every playbook by its FQCN, ``ansible-doc`` on every module and the ``ansible-test sanity`` tests that
run offline (docs/testing.md, "The collection tarball").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.integration.plugins.ansible_runner import VENV_BIN

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DECOY = "generated-decoy"

# Top-level files and path prefixes a user's install may contain: the product, never the development tree.
ALLOWED_FILES = {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "pyproject.toml",
                 "meta/runtime.yml"}
ALLOWED_PREFIXES = ("agent/hami_agent/", "dashboards/", "docs/", "playbooks/", "plugins/callback/",
                    "plugins/doc_fragments/",
                    "plugins/connection/", "plugins/filter/", "plugins/modules/", "plugins/module_utils/",
                    "plugins/strategy/",
                    "roles/", "inventories/example/", "tools/")

# Generated paths .gitignore does not list (tools that write them are run from other directories too).
EXTRA_GENERATED = tuple(p.format(d=DECOY) for p in (
    "tests/output/{d}.xml", ".tox/{d}", ".nox/{d}", ".mypy_cache/{d}", "htmlcov/{d}.html", ".coverage.{d}",
    "dist/{d}.tar.gz", "extensions/molecule/default/.molecule/{d}", "hami-node-{d}.tar.gz",
    "agent/hami_agent/{d}.pyo", "roles/hami_agent/.pytest_cache/{d}", "agent/.hypothesis/{d}",
    "agent/hami_agent/{d}.swp"))

# ansible-test sanity tests that need no network. The others (ansible-doc, import, pep8, pylint,
# runtime-metadata, validate-modules, yamllint) install their requirements into a venv bootstrapped with
# a pip script ansible-test downloads, which fails offline; tests/unit/plugins/test_module_docs.py and
# scripts/lint-ansible.sh cover their core instead.
OFFLINE_SANITY = ("action-plugin-docs", "changelog", "compile", "empty-init", "ignores", "line-endings",
                  "no-assert", "no-get-exception", "no-illegal-filenames", "no-smart-quotes",
                  "replace-urlopen", "shebang", "symlinks", "use-argspec-type-path", "use-compat-six")


def _source_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [p for p in out.splitlines() if (REPO / p).is_file()]


def _decoys() -> list[str]:
    """One planted file per .gitignore entry (at the root and, for unanchored entries, nested) plus
    EXTRA_GENERATED. Their names carry DECOY so the tarball check can find any that slipped through."""
    paths: list[str] = []
    for line in (REPO / ".gitignore").read_text().splitlines():
        entry = line.strip()
        if not entry or entry.startswith(("#", "!")):
            continue
        is_dir = entry.endswith("/")
        name = entry.strip("/").replace("*", DECOY)
        anchored = "/" in name
        for base in ("",) if anchored else ("", "agent/hami_agent/", "roles/hami_agent/files/"):
            target = base + name
            paths.append(f"{target}/{DECOY}.txt" if is_dir else target)
    return paths + list(EXTRA_GENERATED)


def _env(home: Path, collections: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1", "HOME": str(home),
                "ANSIBLE_LOCAL_TEMP": str(home / "tmp"), "LC_ALL": "C.UTF-8",
                "PATH": f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"})
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 120) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(tarball member names, installed collection directory, env) for the built-and-installed copy."""
    if not (VENV_BIN / "ansible-galaxy").exists():
        pytest.skip("ansible-core is not installed (it needs Python >= 3.11: make setup)")
    tmp = tmp_path_factory.mktemp("collection")
    src, dist, collections, home = tmp / "src", tmp / "dist", tmp / "collections", tmp / "home"
    for rel in _source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    for rel in _decoys():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("generated\n")
    home.mkdir()
    env = _env(home, collections)
    _run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist)], src, env)
    (tarball,) = dist.glob("hami-node-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    # --no-deps: the dependencies come with the `ansible` package here, and Galaxy is not reachable
    _run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(collections),
          str(tarball)], tmp, env)
    return names, collections / "ansible_collections" / "hami" / "node", env, src


def test_tarball_holds_the_product_and_nothing_generated(installed):
    names, _, _, src = installed
    leaked = [n for n in names if DECOY in n or "__pycache__" in n or n.endswith(".pyc")]
    assert not leaked, f"generated files in the tarball (add them to galaxy.yml build_ignore): {leaked}"
    outside = [n for n in names if n not in ALLOWED_FILES and not n.startswith(ALLOWED_PREFIXES)]
    assert not outside, f"files outside the allowlist in the tarball: {outside}"
    # and nothing the product needs is dropped: every source file under the allowlist ships
    wanted = {p for p in _source_files() if (p in ALLOWED_FILES or p.startswith(ALLOWED_PREFIXES))}
    missing = sorted(wanted - set(names))
    assert not missing, f"source files missing from the tarball (too wide a build_ignore?): {missing}"
    assert {"plugins/filter/known_bad_driver.py", "playbooks/site.yml", "agent/hami_agent/cli.py",
            "roles/hami_agent/tasks/main.yml", "dashboards/hami-node.json"} <= set(names)
    assert (src / f"agent/hami_agent/{DECOY}.pyc").exists()  # the decoys were really planted


def test_dependencies_declare_every_collection_the_content_calls(installed):
    _, root, _, _ = installed
    declared = set(json.loads((root / "MANIFEST.json").read_text())["collection_info"]["dependencies"])
    used: set[str] = set()
    for path in [*root.glob("roles/**/*.yml"), *root.glob("playbooks/**/*.yml")]:
        used |= {m.group(1) for m in re.finditer(r"\b([a-z_]+\.[a-z_]+)\.[a-z_0-9]+\b", path.read_text())
                 if m.group(1).split(".")[0] in {"community", "kubernetes", "ansible"}}
    used -= {"ansible.builtin", "ansible.legacy"}
    assert used, "the scan found no collection calls at all: the pattern is broken"
    assert used <= declared, f"galaxy.yml dependencies miss {sorted(used - declared)}"


def test_playbooks_pass_syntax_check_by_fqcn_from_the_install(installed):
    names, root, env, _ = installed
    books = sorted(Path(n).stem for n in names if re.fullmatch(r"playbooks/[a-z0-9_]+\.yml", n))
    assert "site" in books and sum(b.startswith("remediate_") for b in books) >= 4, books
    out = _run([str(VENV_BIN / "ansible-playbook"), "--syntax-check", *(f"hami.node.{b}" for b in books)],
               root.parents[3], env, timeout=240)
    for b in books:  # resolved from the install, not from this checkout
        assert f"playbook: {root}/playbooks/{b}.yml" in out, out


def test_ansible_doc_renders_every_module_from_the_install(installed):
    names, root, env, _ = installed
    modules = sorted(Path(n).stem for n in names if re.fullmatch(r"plugins/modules/[a-z0-9_]+\.py", n))
    assert len(modules) >= 6, modules
    docs = json.loads(_run([str(VENV_BIN / "ansible-doc"), "--json", *(f"hami.node.{m}" for m in modules)],
                           root.parents[3], env))
    assert sorted(docs) == [f"hami.node.{m}" for m in modules], sorted(docs)
    for name, doc in docs.items():
        assert doc["doc"]["short_description"] and doc["doc"]["options"], name
        assert doc["doc"]["filename"].startswith(str(root)), (name, doc["doc"]["filename"])


def test_offline_ansible_test_sanity_passes_on_the_install(installed):
    _, root, env, _ = installed
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    tests = [arg for t in OFFLINE_SANITY for arg in ("--test", t)]
    out = _run([str(VENV_BIN / "ansible-test"), "sanity", "--python", python, *tests], root, env, timeout=240)
    for t in OFFLINE_SANITY:
        assert f'Running sanity test "{t}"' in out, out
