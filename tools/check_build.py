#!/usr/bin/env python3
"""Checks that the Bazel BUILD files agree with the Python sources (stdlib only, well under a second).

Usage: python tools/check_build.py [--root DIR]

BUILD files are Starlark, a subset of Python's syntax, so they are read with `ast`. The conventions checked
are documented at the top of the root BUILD file. The check fails (exit code 1), naming the BUILD file, the
target and the module, when:

* a .py file under fedpersonal/, experiments/, tests/ or tools/ is not in the `srcs` of exactly one target
  (the `__init__.py` files of the pytest packages under tests/ are exempt), or its directory has no BUILD
  file of its own; a ready-to-paste target is printed for such a file;
* a `srcs` entry does not exist, is not a .py file, or lies in another Bazel package;
* a label in `deps` or `data` names no existing target (or source file), an external repository, or a
  target that is not visible to the depending package (Bazel's rules for //visibility:*, __pkg__,
  __subpackages__ and package_group);
* a module imports a first-party module (`import fedpersonal.a.b`, `from fedpersonal.a import b` where b is
  a submodule, `from fedpersonal.a import Name`, relative imports) whose target is not a direct dep of the
  importing module's target; or a dep is imported by none of the target's srcs (a stale dep: a trailing
  `# keep` comment on the dep's line keeps a dep that is needed without an import statement);
* a third-party module is imported without a `"pydep:<top-level module>"` tag on the target, or such a tag
  names a module that none of the target's srcs imports;
* a py_binary or py_test uses a module of a first-party package whose top-level `__init__.py` has code
  (fedpersonal/__init__.py does) but is not in its transitive deps: Python always runs that file first,
  but Bazel puts an empty `__init__.py` in the runfiles in place of one that no dep provides.

Imports are collected from the whole module: function-level (lazy) and `if TYPE_CHECKING:` imports count.
On success it prints `BUILD check: N targets, M modules, OK`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import sys
from typing import Optional

# Top-level directories whose .py files must be in BUILD targets; also the first-party import roots.
SCAN_ROOTS = ('fedpersonal', 'experiments', 'tests', 'tools')
# Directories whose __init__.py files need no target (pytest packages).
EXEMPT_INIT_ROOTS = ('tests',)
PY_RULES = ('py_library', 'py_binary', 'py_test')
PYDEP_TAG = 'pydep:'
KEEP_COMMENT = '# keep'
_BUILD_NAMES = ('BUILD.bazel', 'BUILD')
_SKIP_DIRS = {'__pycache__', 'node_modules', 'build', 'dist', 'output'}
_STDLIB = set(getattr(sys, 'stdlib_module_names', ())) | set(sys.builtin_module_names) | {'__future__'}


@dataclasses.dataclass
class Dep:
    label: str  # As written in the BUILD file.
    canonical: Optional[str]  # '//pkg:name'; None when malformed or external.
    lineno: int
    keep: bool  # Marked `# keep`: exempt from the stale-dep check.


@dataclasses.dataclass
class Target:
    package: str  # '' for the root package, else e.g. 'fedpersonal/algorithms'.
    name: str
    kind: str
    build_file: str
    lineno: int
    srcs: list = dataclasses.field(default_factory=list)  # Paths relative to the root.
    deps: list = dataclasses.field(default_factory=list)  # [Dep]
    data: list = dataclasses.field(default_factory=list)  # [Dep]
    tags: list = dataclasses.field(default_factory=list)
    visibility: Optional[list] = None  # None: the package's default_visibility.
    packages: Optional[list] = None  # package_group only.

    @property
    def label(self) -> str:
        return f'//{self.package}:{self.name}'

    def where(self) -> str:
        return f'{self.build_file}:{self.lineno}: {self.label}'


@dataclasses.dataclass
class Import:
    module: str  # Resolved first-party module, or a third-party top-level module name.
    lineno: int
    first_party: bool


def _strings(node) -> Optional[list]:
    """The value of a literal list of strings, or None."""
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                          for e in node.elts):
        return [e.value for e in node.elts]
    return None


def _in_tree(package: str, root: str) -> bool:
    return not root or package == root or package.startswith(root + '/')


def module_name(rel: str) -> str:
    parts = rel[:-len('.py')].split('/')
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


class Checker:
    """Reads the BUILD files and Python sources below `root` and collects problems in `errors`."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.errors: list[str] = []
        self.build_files: dict[str, str] = {}  # package -> BUILD file path
        self.targets: dict[str, Target] = {}  # canonical label -> target
        self.default_visibility: dict[str, list] = {}  # package -> package(default_visibility = ...)
        self.py_files: list[str] = []
        self.owners: dict[str, list[Target]] = {}  # .py path -> targets that list it in srcs
        self.first_party = {r for r in SCAN_ROOTS if os.path.isdir(os.path.join(self.root, r))}
        self._imports: dict[str, list[Import]] = {}

    def _isfile(self, rel: str) -> bool:
        return os.path.isfile(os.path.join(self.root, rel))

    def package_of(self, rel: str) -> Optional[str]:
        """The Bazel package of a file: its nearest enclosing directory that has a BUILD file."""
        d = os.path.dirname(rel)
        while d not in self.build_files:
            if not d:
                return None
            d = os.path.dirname(d)
        return d

    def module_file(self, module: str) -> Optional[str]:
        """Path of the file defining a first-party module; '' for a namespace package; None if none."""
        base = module.replace('.', '/')
        for rel in (base + '.py', base + '/__init__.py'):
            if self._isfile(rel):
                return rel
        return '' if os.path.isdir(os.path.join(self.root, base)) else None

    # ----------------------------------------------------------------------------------------- BUILD files

    def find_build_files(self):
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, '/')
            rel_dir = '' if rel_dir == '.' else rel_dir
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(('.', 'bazel-'))
                                 and d not in _SKIP_DIRS and not d.endswith('.egg-info'))
            present = [b for b in _BUILD_NAMES if b in filenames]
            if len(present) > 1:
                self.errors.append(f'{rel_dir or "."}: both BUILD and BUILD.bazel exist; keep one')
            if present:
                self.build_files[rel_dir] = f'{rel_dir}/{present[0]}' if rel_dir else present[0]

    @staticmethod
    def canonical_label(label: str, package: str) -> Optional[str]:
        if label.startswith('//'):
            pkg, _, name = label[2:].partition(':')
            name = name or pkg.rsplit('/', 1)[-1]
        elif label.startswith(':'):
            pkg, name = package, label[1:]
        elif ':' in label or label.startswith('@'):
            return None  # Malformed, or an external repository (cannot be fetched offline).
        else:
            pkg, name = package, label
        if not name or pkg.endswith('/') or '//' in pkg or ':' in name:
            return None
        return f'//{pkg}:{name}'

    def label_exists(self, canonical: str) -> bool:
        if canonical in self.targets:
            return True
        pkg, name = canonical[2:].split(':', 1)
        rel = f'{pkg}/{name}' if pkg else name  # A source file is a target of its package too.
        return pkg in self.build_files and self._isfile(rel) and self.package_of(rel) == pkg

    def parse_build_file(self, package: str, build_file: str):
        try:
            with open(os.path.join(self.root, build_file), encoding='utf-8') as f:
                source = f.read()
            tree = ast.parse(source, filename=build_file)
        except (SyntaxError, UnicodeDecodeError) as e:
            self.errors.append(f'{build_file}: cannot parse as Starlark: {e}')
            return
        lines = source.splitlines()
        for stmt in tree.body:
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                continue
            kind = call.func.id
            kwargs = {kw.arg: kw.value for kw in call.keywords if kw.arg}
            if kind == 'package' and 'default_visibility' in kwargs:
                self.default_visibility[package] = _strings(kwargs['default_visibility']) or []
            if 'name' not in kwargs:
                continue  # load(), package(), licenses(), ...
            name = kwargs['name'].value if isinstance(kwargs['name'], ast.Constant) else None
            if not isinstance(name, str):
                self.errors.append(f'{build_file}:{call.lineno}: {kind}: `name` must be a string literal')
                continue
            target = Target(package, name, kind, build_file, call.lineno)
            if target.label in self.targets:
                self.errors.append(f'{build_file}:{call.lineno}: duplicate target name "{name}"')
                continue
            self.targets[target.label] = target
            for attr in ('visibility', 'packages'):
                if attr in kwargs:
                    setattr(target, attr, _strings(kwargs[attr]) or [])
            if kind not in PY_RULES:
                continue
            for attr in ('srcs', 'deps', 'data', 'tags', 'visibility'):
                node = kwargs.get(attr)
                if node is not None and _strings(node) is None:
                    self.errors.append(f'{target.where()}: `{attr}` must be a literal list of strings (no '
                                       'glob(), select() or variables: BUILD files are read statically)')
                    continue
                for elt in node.elts if attr != 'visibility' and node is not None else []:
                    if attr == 'srcs':
                        self._add_src(target, elt.value)
                    elif attr == 'tags':
                        target.tags.append(elt.value)
                    else:
                        line = lines[elt.lineno - 1]
                        keep = '#' in line and line[line.index('#'):].startswith(KEEP_COMMENT)
                        canonical = self.canonical_label(elt.value, package)
                        getattr(target, attr).append(Dep(elt.value, canonical, elt.lineno, keep))

    def visible(self, target: Target, from_package: str) -> bool:
        """Bazel's visibility rule, for //visibility:*, __pkg__, __subpackages__ and package_group labels."""
        if target.package == from_package:
            return True
        specs = target.visibility if target.visibility is not None else self.default_visibility.get(
            target.package, [])
        for spec in specs:
            canonical = self.canonical_label(spec, target.package)
            if spec == '//visibility:public':
                return True
            if canonical is None:
                continue
            pkg, name = canonical[2:].split(':', 1)
            if name == '__pkg__' and from_package == pkg:
                return True
            if name == '__subpackages__' and _in_tree(from_package, pkg):
                return True
            group = self.targets.get(canonical)
            for pattern in (group.packages or []) if group and group.kind == 'package_group' else []:
                if pattern in ('public', '//...') or pattern == f'//{from_package}' or (
                        pattern.endswith('/...') and _in_tree(from_package, pattern[2:-4])):
                    return True
        return False

    def _add_src(self, target: Target, src: str):
        if src.startswith('//'):
            canonical = self.canonical_label(src, target.package) or '//:'
            pkg, src = canonical[2:].split(':', 1)
            if pkg != target.package:
                self.errors.append(f'{target.where()}: srcs entry "//{pkg}:{src}" is in another package')
                return
        src = src.lstrip(':')
        rel = f'{target.package}/{src}' if target.package else src
        if not src.endswith('.py'):
            self.errors.append(f'{target.where()}: srcs entry "{src}" is not a .py file')
        elif not self._isfile(rel):
            self.errors.append(f'{target.where()}: srcs entry "{src}" does not exist ({rel})')
        elif self.package_of(rel) != target.package:
            owner = self.package_of(rel)
            self.errors.append(f'{target.where()}: srcs entry "{src}" belongs to package //{owner} '
                               f'({self.build_files[owner]}); list it there')
        else:
            target.srcs.append(rel)
            self.owners.setdefault(rel, []).append(target)

    # --------------------------------------------------------------------------------------------- imports

    def find_py_files(self):
        for top in sorted(self.first_party):
            for dirpath, dirnames, filenames in os.walk(os.path.join(self.root, top)):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith('.') and d not in _SKIP_DIRS)
                rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, '/')
                self.py_files += [f'{rel_dir}/{fn}' for fn in sorted(filenames) if fn.endswith('.py')]

    def imports_of(self, rel: str) -> list[Import]:
        """Every import statement of a module (module level, in functions, in `if TYPE_CHECKING:`)."""
        if rel in self._imports:
            return self._imports[rel]
        found: list[Import] = []
        self._imports[rel] = found
        try:
            with open(os.path.join(self.root, rel), encoding='utf-8') as f:
                tree = ast.parse(f.read(), filename=rel)
        except (SyntaxError, UnicodeDecodeError) as e:
            self.errors.append(f'{rel}: cannot parse: {e}')
            return found
        module = module_name(rel)
        package = module if rel.endswith('/__init__.py') else module.rpartition('.')[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._resolve(found, rel, node.lineno, alias.name, None, relative=False)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = package.split('.') if package else []
                    if node.level > len(parts):
                        self.errors.append(f'{rel}:{node.lineno}: relative import beyond the top-level package')
                        continue
                    base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    self._resolve(found, rel, node.lineno, base, alias.name, relative=bool(node.level))
        return found

    def _resolve(self, found, rel, lineno, base, name, relative):
        top = base.split('.')[0]
        if not relative and top not in self.first_party:
            if top and top not in _STDLIB:
                found.append(Import(top, lineno, first_party=False))
            return
        if name not in (None, '*') and self.module_file(f'{base}.{name}') is not None:
            found.append(Import(f'{base}.{name}', lineno, first_party=True))  # `from pkg import submodule`
        elif self.module_file(base) is not None:
            found.append(Import(base, lineno, first_party=True))
        else:
            imported = f'{base}.{name}' if name not in (None, '*') else base
            self.errors.append(f'{rel}:{lineno}: imports first-party module "{imported}", which does not exist')

    # ---------------------------------------------------------------------------------------------- checks

    @staticmethod
    def short_label(label: str, package: str) -> str:
        pkg, name = label[2:].split(':', 1)
        if pkg == package:
            return f':{name}'
        return f'//{pkg}' if pkg.rsplit('/', 1)[-1] == name else label

    def required(self, srcs: list[str], self_label: Optional[str]):
        """Deps that srcs need: ({first-party label: [(src, module, line)]}, {third-party top: [(src, line)]})."""
        first: dict[str, list] = {}
        third: dict[str, list] = {}
        for src in srcs:
            for imp in self.imports_of(src):
                if not imp.first_party:
                    third.setdefault(imp.module, []).append((src, imp.lineno))
                    continue
                owners = self.owners.get(self.module_file(imp.module) or '')
                # A namespace package needs no dep; a module in no target is reported as such.
                if owners and owners[0].label != self_label:
                    first.setdefault(owners[0].label, []).append((src, imp.module, imp.lineno))
        return first, third

    def suggest(self, rel: str) -> str:
        """A ready-to-paste target for a file that is in none (for the BUILD file in its directory)."""
        package = os.path.dirname(rel)
        filename = os.path.basename(rel)
        name = os.path.basename(package) if filename == '__init__.py' else filename[:-len('.py')]
        kind = ('py_library' if filename == '__init__.py' else 'py_test' if name.endswith('_test') else
                'py_binary' if rel.startswith('experiments/') else 'py_library')
        first, third = self.required([rel], None)
        lines = [f'{kind}(', f'    name = "{name}",', f'    srcs = ["{filename}"],']
        if len(third) == 1:
            lines.append(f'    tags = ["{PYDEP_TAG}{next(iter(third))}"],')
        elif third:  # Multi-line, as buildifier formats lists of more than one element.
            lines += ['    tags = ['] + [f'        "{PYDEP_TAG}{t}",' for t in sorted(third)] + ['    ],']
        if first:
            labels = sorted((self.short_label(l, package) for l in first), key=lambda l: (l[0] != ':', l))
            lines += ['    deps = ['] + [f'        "{l}",' for l in labels] + ['    ],']
        return '\n'.join('    ' + l for l in lines + [')'])

    def check_coverage(self):
        for rel in self.py_files:
            owners = self.owners.get(rel, [])
            exempt = os.path.basename(rel) == '__init__.py' and rel.split('/')[0] in EXEMPT_INIT_ROOTS
            directory = os.path.dirname(rel)
            if len(owners) > 1:
                self.errors.append(f'{rel}: module is in the srcs of {len(owners)} targets: '
                                   + ', '.join(t.where() for t in owners))
            elif not owners and not exempt:
                if directory in self.build_files:
                    how = f'add to {self.build_files[directory]}'
                else:
                    how = f'create {directory}/BUILD (one BUILD file per Python directory) with'
                self.errors.append(f'{rel}: module is in no target; {how}:\n{self.suggest(rel)}')

    def check_target(self, target: Target):
        for attr in ('deps', 'data'):
            for dep in getattr(target, attr):
                where = f'{target.build_file}:{dep.lineno}: {target.label}'
                if dep.canonical is None:
                    self.errors.append(f'{where}: {attr} label "{dep.label}" is malformed or external '
                                       '(only //pkg:name and :name labels resolve offline)')
                elif not self.label_exists(dep.canonical):
                    self.errors.append(f'{where}: {attr} label "{dep.label}" names no existing target')
                elif dep.canonical in self.targets and not self.visible(self.targets[dep.canonical], target.package):
                    dep_target = self.targets[dep.canonical]
                    self.errors.append(f'{where}: {attr} label "{dep.label}" is not visible to //{target.package} '
                                       f'(see the visibility of {dep_target.where()})')
        first, third = self.required(target.srcs, target.label)
        declared = {d.canonical: d for d in target.deps if d.canonical}
        for label, uses in sorted(first.items()):
            if label not in declared:
                src, module, lineno = uses[0]
                self.errors.append(f'{target.where()}: {src}:{lineno} imports {module}, but '
                                   f'"{self.short_label(label, target.package)}" is not in deps')
        for label, dep in declared.items():
            if label not in first and not dep.keep and self.label_exists(label):
                self.errors.append(f'{target.build_file}:{dep.lineno}: {target.label}: stale dep "{dep.label}": '
                                   f'no module in srcs imports it (remove it, or end the line with '
                                   f'"{KEEP_COMMENT}" if it is needed without an import)')
        tags = {t[len(PYDEP_TAG):] for t in target.tags if t.startswith(PYDEP_TAG)}
        for top, uses in sorted(third.items()):
            if top not in tags:
                src, lineno = uses[0]
                self.errors.append(f'{target.where()}: {src}:{lineno} imports third-party module "{top}", '
                                   f'but tag "{PYDEP_TAG}{top}" is missing')
        for top in sorted(tags - set(third)):
            self.errors.append(f'{target.where()}: stale tag "{PYDEP_TAG}{top}": no module in srcs imports "{top}"')

    def transitive_deps(self, target: Target) -> dict[str, Target]:
        closure: dict[str, Target] = {}
        stack = [target]
        while stack:
            for dep in stack.pop().deps:
                if dep.canonical in self.targets and dep.canonical not in closure:
                    closure[dep.canonical] = self.targets[dep.canonical]
                    stack.append(closure[dep.canonical])
        return closure

    def has_code(self, rel: str) -> bool:
        """Whether a file does more than an empty (or docstring-only) file would."""
        try:
            with open(os.path.join(self.root, rel), encoding='utf-8') as f:
                body = ast.parse(f.read()).body
        except (SyntaxError, UnicodeDecodeError):
            return True
        return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)

    def check_runfiles(self, target: Target):
        """Executables need each non-empty top-level `__init__.py` of the first-party packages they use."""
        closure = self.transitive_deps(target)
        used_tops = {rel.split('/')[0] for t in [target, *closure.values()] for rel in t.srcs}
        used_tops |= {imp.module.split('.')[0] for rel in target.srcs for imp in self.imports_of(rel)
                      if imp.first_party}
        for top in sorted(used_tops):
            owners = self.owners.get(f'{top}/__init__.py')
            if (owners and owners[0].label != target.label and owners[0].label not in closure
                    and self.has_code(f'{top}/__init__.py')):
                self.errors.append(
                    f'{target.where()}: uses {top} modules but {self.short_label(owners[0].label, target.package)} '
                    f'is not in its transitive deps: {top}/__init__.py would be replaced by an empty file in '
                    f'the runfiles (add it to deps with a "{KEEP_COMMENT}: ..." comment)')

    def run(self) -> int:
        self.find_build_files()
        for package, build_file in sorted(self.build_files.items()):
            self.parse_build_file(package, build_file)
        self.find_py_files()
        self.check_coverage()
        for target in self.targets.values():
            if target.kind in PY_RULES:
                self.check_target(target)
            if target.kind in ('py_binary', 'py_test'):
                self.check_runfiles(target)
        n_targets = sum(t.kind in PY_RULES for t in self.targets.values())
        n_modules = sum(rel in self.owners for rel in self.py_files)
        for error in self.errors:
            print(error)
        status = f'{len(self.errors)} problem(s)' if self.errors else 'OK'
        print(f'BUILD check: {n_targets} targets, {n_modules} modules, {status}')
        return 1 if self.errors else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--root', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help='repository root (default: the parent directory of tools/)')
    return Checker(parser.parse_args(argv).root).run()


if __name__ == '__main__':
    sys.exit(main())
