"""archplace from Python: estimate and validate training plans in process.

    >>> import archplace
    >>> e = archplace.estimate("config/specs/estimate-llama3-70b-h100.toml")
    >>> e.step_seconds, e.tokens_per_second_per_device
    >>> e.breakdown          # where the step goes (a pandas DataFrame with pandas installed)
    >>> print(e)             # the report `archplace estimate` prints

Every number is the one `archplace estimate --json` prints for the same spec, to the bit:
the package calls the same Rust functions in this process (no subprocess), with the GIL
released while they run. A spec is a path, TOML text or a dict of its tables.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Union

from . import _archplace

__all__ = [
    "Estimate",
    "SpecError",
    "SpecProblem",
    "estimate",
    "validate",
    "__version__",
]

__version__: str = _archplace.__version__

#: The cost-model plugins the wheel ships (reference and gpu-like), searched before the
#: default folders (``~/.local/share/archplace/plugins``, ``$ARCHPLACE_PLUGIN_DIRS``).
PLUGIN_DIR = Path(__file__).resolve().parent / "plugins"

SpecLike = Union[str, "os.PathLike[str]", Mapping[str, Any]]


class SpecProblem(NamedTuple):
    """One mistake in a spec, located as the CLI locates it."""

    file: str
    #: 1-based; 0 when the problem has no place in the file.
    line: int
    #: 1-based, in characters.
    column: int
    #: The dotted key, e.g. ``training.micro_batch_sizes[1]``; empty for the whole file.
    key: str
    message: str
    #: What would be valid, when archplace can say.
    help: Optional[str]


class SpecError(ValueError):
    """A spec with problems: ``errors`` lists every one (one pass finds them all), and
    ``str(error)`` is the report ``archplace validate`` prints."""

    def __init__(self, rendered: str, errors: List[SpecProblem]) -> None:
        super().__init__(rendered)
        self.errors = errors

    def __str__(self) -> str:
        return self.args[0]


def _plugin_dirs(plugin_dir: Union[None, str, "os.PathLike[str]"]) -> List[str]:
    dirs = [] if plugin_dir is None else [os.fspath(plugin_dir)]
    if PLUGIN_DIR.is_dir():
        dirs.append(str(PLUGIN_DIR))
    return dirs


def _spec_args(spec: SpecLike) -> Tuple[Optional[str], Optional[str], str]:
    """(path, text, name) of a spec given as a path, TOML text or a dict."""
    if isinstance(spec, Mapping):
        return None, _archplace.toml_text(json.dumps(spec)), "<dict>"
    if isinstance(spec, os.PathLike):
        return os.fspath(spec), None, os.fspath(spec)
    if isinstance(spec, str):
        # TOML text has a line break or a `=`; a path has neither (or names a file).
        if ("\n" in spec or "=" in spec) and not os.path.isfile(spec):
            return None, spec, "<string>"
        return spec, None, spec
    raise TypeError(f"a spec is a path, TOML text or a dict, not {type(spec).__name__}")


def _native(call, *args):
    """Calls the native module, its spec errors raised as ``SpecError``."""
    try:
        return call(*args)
    except _archplace.NativeSpecError as e:
        rendered, problems = e.args
        raise SpecError(
            rendered,
            [
                SpecProblem(
                    p.get("file", ""),
                    p.get("line", 0),
                    p.get("column", 0),
                    p.get("field", ""),
                    p.get("message", ""),
                    p.get("help"),
                )
                for p in json.loads(problems)
            ],
        ) from None


def validate(spec: SpecLike, plugin_dir: Union[None, str, "os.PathLike[str]"] = None) -> None:
    """Checks a spec as ``archplace validate`` does, the plugins it names included; raises
    ``SpecError`` with every problem located."""
    path, text, name = _spec_args(spec)
    _native(_archplace.validate, path, text, name, _plugin_dirs(plugin_dir))


class Estimate:
    """One training step, explained: every field of ``archplace estimate --json`` as an
    attribute (``step_seconds``, ``time``, ``memory_bytes``, ``tokens_per_second_per_device``,
    ``step_seconds_interval``, …), ``to_dict()``, ``breakdown`` and the text report as
    ``str(estimate)``."""

    def __init__(self, document: Dict[str, Any], text: str, feasible: bool) -> None:
        self._document = document
        self._text = text
        #: Whether the plan runs on the chip (``why`` says what stops it when not).
        self.feasible = feasible

    def __getattr__(self, name: str) -> Any:
        document = self.__dict__.get("_document", {})
        if name in document:
            return document[name]
        raise AttributeError(f"an estimate has no field `{name}`")

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._document))

    def __iter__(self) -> Iterator[str]:
        return iter(self._document)

    def to_dict(self) -> Dict[str, Any]:
        """``estimate --json``'s document (a copy)."""
        return json.loads(json.dumps(self._document))

    @property
    def breakdown(self) -> Any:
        """Where the step goes: one row per part of ``time`` (seconds, share of the step),
        a pandas DataFrame when pandas is installed, else a list of dicts."""
        step = self._document.get("step_seconds") or 0.0
        rows = [
            {
                "part": key[: -len("_seconds")] if key.endswith("_seconds") else key,
                "seconds": value,
                "share": value / step if step else 0.0,
            }
            for key, value in (self._document.get("time") or {}).items()
            if isinstance(value, (int, float))
        ]
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows, columns=["part", "seconds", "share"]).set_index("part")

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        if not self.feasible:
            return f"<archplace.Estimate {self._document.get('spec')!r}: cannot run>"
        return (
            f"<archplace.Estimate {self._document.get('spec')!r}: "
            f"step {self._document.get('step_seconds'):.6g} s, "
            f"{self._document.get('tokens_per_second_per_device'):.6g} tokens/s per device>"
        )


def estimate(
    spec: SpecLike,
    calibration: Union[None, str, "os.PathLike[str]"] = None,
    plugin_dir: Union[None, str, "os.PathLike[str]"] = None,
) -> Estimate:
    """Estimates one training step of a spec with an ``[accelerator]`` and a ``[plan]``, as
    ``archplace estimate`` does (the calibration given, else the spec's or its stack's).
    Raises ``SpecError`` for a spec with problems; a plan that does not fit is an answer:
    ``feasible`` is False and ``str()`` says why."""
    path, text, name = _spec_args(spec)
    cal = None if calibration is None else os.fspath(calibration)
    document, report, feasible = _native(
        _archplace.estimate, path, text, name, cal, _plugin_dirs(plugin_dir)
    )
    return Estimate(json.loads(document), report, feasible)
