"""Every figure the docs quote comes from one data file, docs/figures.json, which the
benchmarks write (``--record``): a page that quotes a figure differently fails here
(issue 36, item 8). See bench/figures.py."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # figures.py imports its sibling report_files
spec = importlib.util.spec_from_file_location("figures", ROOT / "bench" / "figures.py")
assert spec is not None and spec.loader is not None
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)

HEADLINES = {"inprocess_recovery", "idle_rss", "launch", "crash_propagation", "last_join"}
"""Figures README.md must quote from the data file (the index quotes some of them too)."""


def test_every_quoted_figure_is_the_data_files():
    assert figures.problems() == []


def test_the_headline_figures_of_readme_and_index_are_quoted_from_the_data_file():
    readme = {m[1] for m in figures.MARK.finditer((ROOT / "README.md").read_text())}
    index = {m[1] for m in figures.MARK.finditer((ROOT / "docs" / "index.md").read_text())}
    assert HEADLINES <= readme, HEADLINES - readme
    assert {"inprocess_recovery", "idle_rss"} <= index
    for entry in figures.load().values():
        assert entry["command"] and entry["measured"] and entry["machine"], entry


def test_a_page_that_differs_is_named_and_render_puts_it_right(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "figures.json", tmp_path / "docs" / "figures.json")
    name, entry = next(iter(figures.load().items()))
    page = tmp_path / "README.md"
    page.write_text(f"about <!--fig:{name}-->999 ms<!--/fig--> and more\n")
    (tmp_path / "docs" / "index.md").write_text(
        "".join(f"<!--fig:{n}-->{e['text']}<!--/fig-->\n" for n, e in figures.load().items())
    )
    assert figures.problems(tmp_path) == [
        f"README.md: {name} says '999 ms', docs/figures.json {entry['text']!r}"
    ]
    assert figures.render(tmp_path) == 1
    assert page.read_text() == f"about <!--fig:{name}-->{entry['text']}<!--/fig--> and more\n"
    assert figures.problems(tmp_path) == []


def test_a_gpu_runs_recovery_figures_name_the_gpu_the_spread_and_the_route(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_recovery", ROOT / "bench" / "bench_recovery.py"
    )
    assert spec is not None and spec.loader is not None
    recovery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recovery)
    recovery.ROUTES["agentd-inprocess-cuda-ipc"] = ["CUDA IPC"] * 4 + ["process group"]
    times = {"agentd-inprocess-cuda-ipc": [0.21, 0.19, 0.25, 0.2, 0.22], "agentd": [1.452]}
    medians = {"agentd-inprocess-cuda-ipc": 0.21, "agentd": 1.452}
    found = recovery.gpu_figures(medians, times, 5, 256)
    assert [(name, text) for name, text, _ in found] == [
        ("gpu_inprocess_standby_ipc", "210 ms"),
        ("gpu_default_recovery", "1,452 ms"),
    ]
    assert found[0][2] == (
        "agentd-inprocess-cuda-ipc: crash -> all ranks past the next all-reduce, median of 5 "
        "(190-250 ms), 5/5 recovered, a 256 MiB model on the GPU, gloo; the state by "
        "CUDA IPC 4/5, process group 1/5"
    )
    data = tmp_path / "figures.json"
    figures.record(*found[0], path=data, device="NVIDIA H200, torch 2.11.0+cu130")
    entry = figures.load(data)["gpu_inprocess_standby_ipc"]
    assert entry["machine"].startswith("NVIDIA H200, torch 2.11.0+cu130, ")
