"""The references generated from the option table, checked by the tests against the files
in the repository: ``config/agentd.toml`` (every option, commented, at its default) and the
options page of the docs (``docs/options.md``). Regenerate them with::

    python -m agentd.config.reference toml > config/agentd.toml
    python -m agentd.config.reference markdown > docs/options.md
"""

from __future__ import annotations

import sys

from agentd.config.option import Option
from agentd.config.options import OPTIONS


def example_toml() -> str:
    """The documented example config, generated from :data:`OPTIONS` (see config/)."""
    lines = [
        "# agentd run configuration. Every key is optional; precedence is",
        "# CLI flag > AGENTD_<KEY> > PET_<KEY> > this file > the scheduler's environment",
        "# (--scheduler: Slurm, a Kubernetes Indexed Job) > default.",
        "# Keys accept dashes or underscores. Values below are the defaults.",
        "",
        "# The job: the training script and its arguments (the command line overrides both).",
        '# script = "train.py"',
        '# args = ["--epochs", "10"]',
        "",
    ]
    for option in OPTIONS:
        lines.append(f"# {option.help} ({', '.join(option.flags)})")
        lines.append(f"# {option.name} = {_toml_literal(option)}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _toml_literal(option: Option) -> str:
    value = option.parse(option.default)
    if option.is_flag or type(value) in (int, float):
        return option.default
    return '"' + option.default.replace("\\", "\\\\").replace('"', '\\"') + '"'


def options_markdown() -> str:
    """The options reference page: one row per option, in the table's order."""
    lines = [
        "# Options reference",
        "",
        "<!-- Generated from agentd/config/options.py and supervision_options.py by",
        "     `python -m agentd.config.reference markdown`; the tests check it. -->",
        "",
        "Every option of `agentd run`, in the order `agentd run --help` lists them. Each can",
        "also be set as `AGENTD_<NAME>`, as torchrun's `PET_<NAME>`, by the torch variables",
        "named, or as a key of a `--config` TOML file (the name after `--`, with dashes or",
        "underscores); the precedence is flag, `AGENTD_*`, `PET_*`, torch's variable, file,",
        "the scheduler's environment (`--scheduler`, [Schedulers](schedulers.md)), default.",
        "",
        "| option | default | meaning |",
        "| --- | --- | --- |",
    ]
    for option in OPTIONS:
        default = "" if option.is_flag and option.default in ("", "0", "false") else option.default
        also = [f"`{flag}`" for flag in option.flags[1:]]
        also += [f"`{name}`" for name in option.env_names]
        meaning = f"{_cell(option.help)}<br>Also: {', '.join(also)}."
        lines.append(f"| `{option.flags[0]}` | {_cell(default, code=True)} | {meaning} |")
    return "\n".join(lines) + "\n"


def _cell(text: str, code: bool = False) -> str:
    if not text:
        return ""
    text = text.replace("|", "\\|")
    return f"`{text}`" if code else text


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("toml", "markdown"):
        sys.exit("usage: python -m agentd.config.reference toml|markdown")
    sys.stdout.write(example_toml() if what == "toml" else options_markdown())
