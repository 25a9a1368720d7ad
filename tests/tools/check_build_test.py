"""tools/check_build.py: passes on the real tree, and names the BUILD file, target and module of each defect."""

import importlib.util
import pathlib
import subprocess
import sys
import textwrap
import time

_REPO = pathlib.Path(__file__).resolve().parents[2]
_SCRIPT = _REPO / 'tools' / 'check_build.py'

_spec = importlib.util.spec_from_file_location('check_build', _SCRIPT)
check_build = importlib.util.module_from_spec(_spec)
sys.modules['check_build'] = check_build  # dataclasses look the module up while the class is created.
_spec.loader.exec_module(check_build)

# A small consistent tree: the root package with side effects, a library package, a binary and a test.
_GOOD_TREE = {
    'BUILD': '''
        package_group(name = "users", packages = ["//..."])
    ''',
    'fedpersonal/__init__.py': 'from fedpersonal.core import base as _base\n',
    'fedpersonal/BUILD': '''
        package(default_visibility = ["//:users"])

        py_library(
            name = "fedpersonal",
            srcs = ["__init__.py"],
            deps = ["//fedpersonal/core:base"],
        )
    ''',
    'fedpersonal/core/__init__.py': 'from fedpersonal.core.base import VALUE\n',
    'fedpersonal/core/base.py': 'import os\nimport numpy as np\nVALUE = np.pi + len(os.sep)\n',
    'fedpersonal/core/user.py': '''
        from fedpersonal.core import base
        from . import base as same_base


        def f():
            import tensorflow as tf  # A lazy import counts.
            return tf, base.VALUE, same_base
    ''',
    'fedpersonal/core/BUILD': '''
        package(default_visibility = ["//:users"])

        py_library(
            name = "core",
            srcs = ["__init__.py"],
            deps = [":base"],
        )

        py_library(
            name = "base",
            srcs = ["base.py"],
            tags = ["pydep:numpy"],
        )

        py_library(
            name = "user",
            srcs = ["user.py"],
            tags = ["pydep:tensorflow"],
            deps = [":base"],
        )
    ''',
    'experiments/run.py': 'from absl import app\nimport fedpersonal.core.user\nfrom fedpersonal.core import VALUE\n',
    'experiments/BUILD': '''
        py_binary(
            name = "run",
            srcs = ["run.py"],
            tags = ["pydep:absl"],
            deps = [
                "//fedpersonal",  # keep: fedpersonal/__init__.py has import-time side effects
                "//fedpersonal/core",
                "//fedpersonal/core:user",
            ],
        )
    ''',
    'tests/__init__.py': '',
    'tests/conftest.py': 'import pytest\nimport fedpersonal\n',
    'tests/BUILD': '''
        package(default_visibility = ["//tests:__subpackages__"])

        py_library(
            name = "conftest",
            srcs = ["conftest.py"],
            tags = ["pydep:pytest"],
            deps = ["//fedpersonal"],
        )
    ''',
    'tests/core/__init__.py': '',
    'tests/core/base_test.py': 'from fedpersonal.core.base import VALUE\n\n\ndef test_value():\n    assert VALUE\n',
    'tests/core/BUILD': '''
        py_test(
            name = "base_test",
            srcs = ["base_test.py"],
            deps = [
                "//fedpersonal/core:base",
                "//tests:conftest",  # keep: pytest loads it
            ],
        )
    ''',
}


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip('\n'))


def _check(root, capsys):
    rc = check_build.main(['--root', str(root)])
    return rc, capsys.readouterr().out


def _tree(tmp_path, changes=None):
    """Writes the good tree, with the files in `changes` ({path: text}) added or replaced."""
    _write(tmp_path, {**_GOOD_TREE, **(changes or {})})
    return tmp_path


def _replace(rel, old, new):
    text = textwrap.dedent(_GOOD_TREE[rel])
    assert old in text, old
    return text.replace(old, new)


def test_real_tree_passes_quickly():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(_SCRIPT)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('BUILD check: ') and lines[0].endswith(' modules, OK'), lines
    assert elapsed < 2.0, f'check took {elapsed:.2f}s'


def test_good_synthetic_tree_passes(tmp_path, capsys):
    rc, out = _check(_tree(tmp_path), capsys)
    assert rc == 0, out
    assert out.strip() == 'BUILD check: 7 targets, 7 modules, OK'


def test_missing_src(tmp_path, capsys):
    build = _replace('fedpersonal/core/BUILD', 'srcs = ["user.py"]', 'srcs = ["user.py", "gone.py"]')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert 'fedpersonal/core/BUILD:15: //fedpersonal/core:user: srcs entry "gone.py" does not exist' in out


def test_undeclared_first_party_import(tmp_path, capsys):
    build = _replace('fedpersonal/core/BUILD', 'tags = ["pydep:tensorflow"],\n    deps = [":base"],', 'tags = ["pydep:tensorflow"],')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert ('fedpersonal/core/BUILD:15: //fedpersonal/core:user: fedpersonal/core/user.py:1 imports '
            'fedpersonal.core.base, but ":base" is not in deps') in out


def test_from_package_import_submodule_needs_the_submodule_target(tmp_path, capsys):
    # `from fedpersonal.core import base` needs :base, not the package target :core.
    build = _replace('fedpersonal/core/BUILD', 'tags = ["pydep:tensorflow"],\n    deps = [":base"],',
                     'tags = ["pydep:tensorflow"],\n    deps = [":core"],')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert 'imports fedpersonal.core.base, but ":base" is not in deps' in out
    assert 'stale dep ":core"' in out


def test_from_package_import_name_needs_the_package_target(tmp_path, capsys):
    build = _replace('experiments/BUILD', '"//fedpersonal/core",\n', '')
    rc, out = _check(_tree(tmp_path, {'experiments/BUILD': build}), capsys)
    assert rc == 1
    assert ('experiments/BUILD:1: //experiments:run: experiments/run.py:3 imports fedpersonal.core, '
            'but "//fedpersonal/core" is not in deps') in out


def test_stale_dep(tmp_path, capsys):
    build = _replace('tests/core/BUILD', '"//fedpersonal/core:base",', '"//fedpersonal/core:base",\n"//fedpersonal/core:user",')
    rc, out = _check(_tree(tmp_path, {'tests/core/BUILD': build}), capsys)
    assert rc == 1
    assert ('tests/core/BUILD:6: //tests/core:base_test: stale dep "//fedpersonal/core:user": '
            'no module in srcs imports it') in out


def test_keep_comment_keeps_a_dep_without_import(tmp_path, capsys):
    build = _replace('tests/core/BUILD', '"//fedpersonal/core:base",',
                     '"//fedpersonal/core:base",\n"//fedpersonal/core:user",  # keep: loaded via importlib')
    rc, out = _check(_tree(tmp_path, {'tests/core/BUILD': build}), capsys)
    assert rc == 0, out


def test_dangling_label(tmp_path, capsys):
    build = _replace('tests/core/BUILD', '"//fedpersonal/core:base",', '"//fedpersonal/core:base",\n"//fedpersonal/nope:x",')
    rc, out = _check(_tree(tmp_path, {'tests/core/BUILD': build}), capsys)
    assert rc == 1
    assert 'tests/core/BUILD:6: //tests/core:base_test: deps label "//fedpersonal/nope:x" names no existing target' in out


def test_external_label_is_rejected(tmp_path, capsys):
    build = _replace('tests/core/BUILD', '"//fedpersonal/core:base",', '"//fedpersonal/core:base",\n"@pypi//numpy",')
    rc, out = _check(_tree(tmp_path, {'tests/core/BUILD': build}), capsys)
    assert rc == 1
    assert 'deps label "@pypi//numpy" is malformed or external' in out


def test_py_file_in_no_target_gets_a_suggested_target(tmp_path, capsys):
    root = _tree(tmp_path, {'fedpersonal/core/extra.py': 'import pandas\nfrom fedpersonal.core import base\n'})
    rc, out = _check(root, capsys)
    assert rc == 1
    assert 'fedpersonal/core/extra.py: module is in no target; add to fedpersonal/core/BUILD:' in out
    assert 'name = "extra"' in out and '"pydep:pandas"' in out and '":base",' in out


def test_py_file_in_a_directory_without_build_file(tmp_path, capsys):
    root = _tree(tmp_path, {'fedpersonal/fresh/__init__.py': '', 'fedpersonal/fresh/thing.py': 'import fedpersonal.core\n'})
    rc, out = _check(root, capsys)
    assert rc == 1
    assert 'fedpersonal/fresh/thing.py: module is in no target; create fedpersonal/fresh/BUILD' in out
    assert 'fedpersonal/fresh/__init__.py: module is in no target' in out
    assert '"//fedpersonal/core",' in out


def test_py_file_in_two_targets(tmp_path, capsys):
    build = _replace('fedpersonal/core/BUILD', 'srcs = ["user.py"]', 'srcs = ["user.py", "base.py"]')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert 'fedpersonal/core/base.py: module is in the srcs of 2 targets' in out


def test_src_of_another_package(tmp_path, capsys):
    build = _replace('fedpersonal/BUILD', 'srcs = ["__init__.py"]', 'srcs = ["__init__.py", "core/base.py"]')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/BUILD': build}), capsys)
    assert rc == 1
    assert 'srcs entry "core/base.py" belongs to package //fedpersonal/core' in out


def test_undeclared_and_stale_third_party(tmp_path, capsys):
    build = _replace('fedpersonal/core/BUILD', 'tags = ["pydep:numpy"]', 'tags = ["pydep:pandas"]')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert ('fedpersonal/core/BUILD:9: //fedpersonal/core:base: fedpersonal/core/base.py:2 imports third-party '
            'module "numpy", but tag "pydep:numpy" is missing') in out
    assert '//fedpersonal/core:base: stale tag "pydep:pandas"' in out


def test_missing_first_party_package(tmp_path, capsys):
    root = _tree(tmp_path, {'fedpersonal/core/base.py': 'import numpy\nimport fedpersonal.gone.mod\n'})
    rc, out = _check(root, capsys)
    assert rc == 1
    assert 'fedpersonal/core/base.py:2: imports first-party module "fedpersonal.gone.mod", which does not exist' in out


def test_binary_without_top_level_init_in_runfiles(tmp_path, capsys):
    build = _replace('experiments/BUILD', '"//fedpersonal",  # keep: fedpersonal/__init__.py has import-time side effects\n', '')
    rc, out = _check(_tree(tmp_path, {'experiments/BUILD': build}), capsys)
    assert rc == 1
    assert ('experiments/BUILD:1: //experiments:run: uses fedpersonal modules but //fedpersonal is not in its '
            'transitive deps') in out


def test_empty_top_level_init_is_not_required_in_runfiles(tmp_path, capsys):
    build = _replace('experiments/BUILD', '"//fedpersonal",  # keep: fedpersonal/__init__.py has import-time side effects\n', '')
    root = _tree(tmp_path, {'experiments/BUILD': build, 'fedpersonal/__init__.py': '"""Docstring only."""\n',
                            'fedpersonal/BUILD': _replace('fedpersonal/BUILD', 'deps = ["//fedpersonal/core:base"],', '')})
    rc, out = _check(root, capsys)
    assert rc == 0, out


def test_dep_that_is_not_visible(tmp_path, capsys):
    build = _replace('fedpersonal/core/BUILD', '["//:users"]', '["//fedpersonal:__subpackages__"]')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert ('tests/core/BUILD:5: //tests/core:base_test: deps label "//fedpersonal/core:base" is not visible to '
            '//tests/core (see the visibility of fedpersonal/core/BUILD:9: //fedpersonal/core:base)') in out
    assert '//experiments:run: deps label "//fedpersonal/core" is not visible to //experiments' in out
    assert '//fedpersonal:fedpersonal: deps label' not in out  # //fedpersonal is a subpackage of itself.


def test_test_init_files_are_exempt_but_other_test_files_are_not(tmp_path, capsys):
    root = _tree(tmp_path, {'tests/core/other_test.py': 'def test_x():\n    pass\n'})
    rc, out = _check(root, capsys)
    assert rc == 1
    assert 'tests/core/other_test.py: module is in no target' in out
    assert 'py_test(' in out
    assert '__init__' not in out


def test_non_literal_attribute(tmp_path, capsys):
    build = _replace('fedpersonal/core/BUILD', 'srcs = ["user.py"]', 'srcs = glob(["user.py"])')
    rc, out = _check(_tree(tmp_path, {'fedpersonal/core/BUILD': build}), capsys)
    assert rc == 1
    assert '//fedpersonal/core:user: `srcs` must be a literal list of strings' in out


def test_unparsable_build_file(tmp_path, capsys):
    rc, out = _check(_tree(tmp_path, {'tests/core/BUILD': 'py_test(name = "x",\n'}), capsys)
    assert rc == 1
    assert 'tests/core/BUILD: cannot parse as Starlark' in out


def test_command_line_exit_code_and_summary(tmp_path):
    root = _tree(tmp_path, {'fedpersonal/core/extra.py': ''})
    proc = subprocess.run([sys.executable, str(_SCRIPT), '--root', str(root)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == 'BUILD check: 7 targets, 7 modules, 1 problem(s)'
