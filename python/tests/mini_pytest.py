#!/usr/bin/env python3
"""Runs pytest-style test files where pytest is not installed (the GPU machine's Python image has
PyTorch but maybe no pytest, and nothing can be installed there): a stand-in `pytest` module with
what python/tests uses – mark.parametrize (ids too), mark.skipif, module-level pytestmark, raises
(match too), skip, fail – and a runner that prints one line per test and pytest's closing line.
Used by scripts/device_run.sh only when `import pytest` fails; pytest itself is the real runner.

  python3 python/tests/mini_pytest.py python/tests/test_cuda.py [more files]
"""
import importlib.util
import itertools
import re
import sys
import traceback
import types
from pathlib import Path


class Skipped(Exception):
    pass


class _Failed(AssertionError):
    pass


class _Mark:
    def __init__(self, kind, args, kwargs):
        self.kind, self.args, self.kwargs = kind, args, kwargs

    def __call__(self, fn):
        fn.__dict__.setdefault("_marks", []).append(self)
        return fn


class _MarkFactory:
    def parametrize(self, names, values, ids=None):
        return _Mark("parametrize", (names, values), {"ids": ids})

    def skipif(self, condition, reason=""):
        return _Mark("skipif", (condition,), {"reason": reason})


class _Raises:
    def __init__(self, exc, match=None):
        self.exc, self.match = exc, match

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise _Failed("DID NOT RAISE %s" % self.exc.__name__)
        if not issubclass(kind, self.exc):
            return False
        if self.match and not re.search(self.match, str(value)):
            raise _Failed("%r does not match %r" % (str(value), self.match))
        return True


def _skip(reason=""):
    raise Skipped(reason)


def _fail(message=""):
    raise _Failed(message)


pytest = types.ModuleType("pytest")
pytest.mark = _MarkFactory()
pytest.raises = _Raises
pytest.skip = _skip
pytest.fail = _fail


def _cases(fn):
    """(id, kwargs) of every parameter combination of a test function."""
    axes = []
    for m in reversed(fn.__dict__.get("_marks", [])):
        if m.kind != "parametrize":
            continue
        names, values = m.args
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        ids = m.kwargs["ids"]
        axis = []
        for i, v in enumerate(values):
            vals = v if len(names) > 1 else (v,)
            label = ids(v) if callable(ids) else ids[i] if ids else str(v)
            axis.append((str(label), dict(zip(names, vals))))
        axes.append(axis)
    for combo in itertools.product(*axes):
        yield "-".join(c[0] for c in combo), {k: v for c in combo for k, v in c[1].items()}


def _skip_reason(module, fn):
    marks = getattr(module, "pytestmark", [])
    marks = list(marks) if isinstance(marks, (list, tuple)) else [marks]
    for m in marks + fn.__dict__.get("_marks", []):
        if m.kind == "skipif" and m.args[0]:
            return m.kwargs["reason"]
    return None


def run(paths):
    sys.modules["pytest"] = pytest
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for path in paths:
        path = Path(path).resolve()
        sys.path.insert(0, str(path.parent))
        try:
            if (path.parent / "conftest.py").is_file() and "conftest" not in sys.modules:
                __import__("conftest")  # as pytest does: its sys.path set-up, its helpers
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception:  # an import error fails the file
            print("FAILED %s (import)\n%s" % (path.name, traceback.format_exc()))
            counts["failed"] += 1
            continue
        for name, fn in list(vars(module).items()):
            if not name.startswith("test_") or not callable(fn):
                continue
            for case_id, kwargs in _cases(fn):
                label = "%s::%s%s" % (path.name, name, "[%s]" % case_id if case_id else "")
                reason = _skip_reason(module, fn)
                if reason is not None:
                    print("SKIPPED %s: %s" % (label, reason))
                    counts["skipped"] += 1
                    continue
                try:
                    fn(**kwargs)
                except Skipped as e:
                    print("SKIPPED %s: %s" % (label, e))
                    counts["skipped"] += 1
                except Exception:
                    print("FAILED %s\n%s" % (label, traceback.format_exc()))
                    counts["failed"] += 1
                else:
                    print("PASSED %s" % label)
                    counts["passed"] += 1
                sys.stdout.flush()
    print("%d passed, %d failed, %d skipped" % (counts["passed"], counts["failed"],
                                                counts["skipped"]))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
