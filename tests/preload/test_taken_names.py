"""The names a script takes from a preloaded library, looked up in the zygote (a real
Trainer job forked by default: tests/integration/test_hangs.py)."""

from __future__ import annotations

import textwrap
import types

from agentd.preload.taken_names import look_up, taken


def script(tmp_path, source: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_the_names_taken_from_a_library_before_the_process_may_change(tmp_path):
    path = script(
        tmp_path,
        """\
        import os
        import lib
        from lib import A, B as Bee
        from lib.sub import C
        from lib import *
        from other import D
        os.environ["X"] = "1"
        from lib import E
        """,
    )
    assert taken(path, str(tmp_path), ["lib", "other"]) == {"lib": ["A", "B"], "other": ["D"]}
    assert taken(path, str(tmp_path), ["other"]) == {}  # lib: not known, the reading stops
    assert taken(None, str(tmp_path), ["lib"]) == {}  # -m: no script
    assert taken(str(tmp_path / "missing.py"), str(tmp_path), ["lib"]) == {}


class LazyModule(types.ModuleType):
    """Loads a name when it is looked up, as transformers' top module does."""

    def __init__(self) -> None:
        super().__init__("lazy")
        self.loads: list[str] = []
        self.Loaded = object()

    def __getattr__(self, name: str) -> object:
        if name == "Broken":
            raise ImportError("a missing dependency")
        if name.startswith("_"):
            raise AttributeError(name)
        self.loads.append(name)
        value = object()
        setattr(self, name, value)
        return value


def test_a_lazy_modules_names_are_loaded_once_and_a_failure_is_left_to_the_worker():
    module = LazyModule()
    assert look_up(module, ["Trainer", "Loaded", "Broken", "Trainer"]) == ["Trainer"]
    assert module.loads == ["Trainer"]
