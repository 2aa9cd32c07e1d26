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
    "Calibration",
    "Estimate",
    "SearchResult",
    "Spec",
    "SpecError",
    "SpecProblem",
    "calibrate",
    "estimate",
    "search",
    "validate",
    "__version__",
]

__version__: str = _archplace.__version__

#: The cost-model plugins the wheel ships (reference and gpu-like), searched before the
#: default folders (``~/.local/share/archplace/plugins``, ``$ARCHPLACE_PLUGIN_DIRS``).
PLUGIN_DIR = Path(__file__).resolve().parent / "plugins"

SpecLike = Union[str, "os.PathLike[str]", Mapping[str, Any], "Spec"]


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


class Spec:
    """A spec as data, to vary for sweeps: read from a path, TOML text or a dict;
    ``with_values({"plan.tensor_parallel": 4, "models[0].seq_len": 8192})`` returns a copy
    with those dotted keys set (tables made as needed); ``estimate``, ``search`` and
    ``validate`` take it as they take a path. A spec read from a file keeps its name, so that
    the files it names (a calibration, a stack profile) are found beside it as before, and
    its problems are reported against its TOML text."""

    def __init__(self, source: "Union[SpecLike, Spec]") -> None:
        if isinstance(source, Spec):
            self.data: Dict[str, Any] = json.loads(json.dumps(source.data))
            self.name: str = source.name
            return
        path, text, name = _spec_args(source)
        if isinstance(source, Mapping):
            self.data = json.loads(json.dumps(source))
        else:
            if path is not None:
                text = Path(path).read_text(encoding="utf-8")
            self.data = json.loads(_archplace.json_text(text, name))
        self.name = name

    def with_values(self, values: Mapping[str, Any]) -> "Spec":
        """A copy with each dotted key set: ``plan.micro_batch``, ``models[0].seq_len``."""
        copy = Spec(self)
        for key, value in values.items():
            table: Any = copy.data
            parts = _dotted(key)
            for part in parts[:-1]:
                if isinstance(part, int):
                    table = table[part]
                else:
                    table = table.setdefault(part, {})
            table[parts[-1]] = value
        return copy

    def __getitem__(self, key: str) -> Any:
        value: Any = self.data
        for part in _dotted(key):
            value = value[part]
        return value

    def to_toml(self) -> str:
        """The spec as TOML text."""
        return _archplace.toml_text(json.dumps(self.data))

    def __repr__(self) -> str:
        return f"<archplace.Spec {self.data.get('name', self.name)!r}>"


def _dotted(key: str) -> List[Union[str, int]]:
    """``models[0].seq_len`` → ``["models", 0, "seq_len"]``."""
    parts: List[Union[str, int]] = []
    for word in key.split("."):
        name, _, rest = word.partition("[")
        if name:
            parts.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            parts.append(int(index))
            rest = rest.lstrip("[")
    if not parts:
        raise KeyError(key)
    return parts


def _spec_args(spec: SpecLike) -> Tuple[Optional[str], Optional[str], str]:
    """(path, text, name) of a spec given as a path, TOML text, a dict or a ``Spec``."""
    if isinstance(spec, Spec):
        return None, spec.to_toml(), spec.name
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


class SearchResult:
    """A search's result: ``best`` (the winning chip and each model's plan, as in
    ``result.json``), ``explored`` (every evaluated chip, a pandas DataFrame with pandas
    installed), ``explain()`` (the summary ``archplace run`` prints: why the winner wins),
    the plots as SVG text (``pareto_svg``, ``placement_svg``, ``timeline_svg``), shown inline
    in notebooks; ``to_dict()`` is ``result.json``."""

    def __init__(
        self,
        document: Dict[str, Any],
        explored: List[Dict[str, Any]],
        summary: str,
        plots: List[Tuple[str, str]],
        interrupted: bool,
    ) -> None:
        self._document = document
        self._explored = explored
        self._summary = summary
        self._plots = dict(plots)
        #: Stopped before the end (the result is the best of what was evaluated).
        self.interrupted = interrupted

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        """The best chip and its plans, or None when no candidate can train the models."""
        return self._document.get("best")

    def to_dict(self) -> Dict[str, Any]:
        """``result.json`` (a copy)."""
        return json.loads(json.dumps(self._document))

    @property
    def explored(self) -> Any:
        """Every evaluated chip, one row each: its configuration (cores, width, depth,
        buffer, area), the HBM size, the throughput (samples/s, None when nothing fits),
        why it failed, and the first model's plan. A pandas DataFrame when pandas is
        installed, else a list of dicts."""
        rows = []
        for line in self._explored:
            row: Dict[str, Any] = {"index": line["index"]}
            row.update(line["configuration"])
            row["hbm_bytes"] = line.get("hbm_bytes")
            row["samples_per_second"] = line.get("mean_throughput_samples_per_second")
            row["failure"] = line.get("failure")
            plans = line.get("plans") or []
            if plans:
                first = plans[0]
                for key in (
                    "tensor_parallel",
                    "pipeline_stages",
                    "data_parallel",
                    "micro_batch",
                    "recomputation",
                    "time_per_batch_seconds",
                ):
                    row[key] = first.get(key)
            rows.append(row)
        try:
            import pandas
        except ImportError:
            return rows
        if not rows:
            return pandas.DataFrame(columns=["index", "samples_per_second"]).set_index("index")
        return pandas.DataFrame(rows).set_index("index")

    def explain(self) -> str:
        """The summary ``archplace run`` prints: how the search went, the best chip and each
        plan, why it wins over the chips it beat, how sure it is."""
        return self._summary

    @property
    def pareto_svg(self) -> str:
        return self._plots["pareto.svg"]

    @property
    def placement_svg(self) -> str:
        return self._plots["placement.svg"]

    @property
    def timeline_svg(self) -> Optional[str]:
        return self._plots.get("timeline.svg")

    def _repr_svg_(self) -> str:
        return self.pareto_svg

    def _repr_html_(self) -> str:
        import html

        return "<pre>{}</pre>{}{}".format(
            html.escape(self._summary), self.pareto_svg, self.placement_svg
        )

    def __str__(self) -> str:
        return self._summary

    def __repr__(self) -> str:
        best = self.best
        if best is None:
            return "<archplace.SearchResult: nothing fits>"
        return "<archplace.SearchResult: best {:.6g} samples/s on {:.4g} mm², {} chips evaluated{}>".format(
            best["mean_throughput_samples_per_second"],
            best["configuration"]["area_mm2"],
            len(self._explored),
            ", interrupted" if self.interrupted else "",
        )


class _ProgressLine:
    """A one-line progress report on stderr, rewritten in place."""

    def __init__(self) -> None:
        import sys

        self._err = sys.stderr

    def __call__(self, kind: str, done: int, total: int, best: Optional[float], area: Optional[float]) -> None:
        what = "bounding" if kind == "bounding" else "searching"
        tail = "" if best is None else f", best {best:.4g} samples/s on {area:.4g} mm²"
        self._err.write(f"\r{what}: {done}/{total} candidates{tail}   ")
        self._err.flush()

    def close(self) -> None:
        self._err.write("\n")
        self._err.flush()


def search(
    spec: SpecLike,
    progress: Any = True,
    calibration: Union[None, str, "os.PathLike[str]"] = None,
    threads: Optional[int] = None,
    out: Union[None, str, "os.PathLike[str]"] = None,
    plugin_dir: Union[None, str, "os.PathLike[str]"] = None,
) -> SearchResult:
    """Searches chips and plans as ``archplace run`` does, in this process on ``threads``
    worker threads (default: every core). ``progress``: True for a line on stderr, a
    callable to get each event as ``(kind, done, total, best_samples_per_second,
    best_area_mm2)``, False for silence. ``out``: also write the result folder there (and
    checkpoint into it, so an interrupted search continues). Ctrl-C stops the search at its
    next candidate and raises ``KeyboardInterrupt``."""
    path, text, name = _spec_args(spec)
    line = _ProgressLine() if progress is True else None
    callback = line if line is not None else (progress if callable(progress) else None)
    try:
        document, explored, summary, plots, interrupted = _native(
            _archplace.search,
            path,
            text,
            name,
            None if calibration is None else os.fspath(calibration),
            _plugin_dirs(plugin_dir),
            threads,
            None if out is None else os.fspath(out),
            callback,
        )
    finally:
        if line is not None:
            line.close()
    return SearchResult(json.loads(document), json.loads(explored), summary, plots, interrupted)


class Calibration:
    """A calibration ``calibrate`` fitted and wrote: ``path`` (apply it with
    ``estimate(spec, calibration=path)``), ``summary`` (``archplace calibrate --json``'s),
    ``factors`` (one row per parameter: factor, 5–95% interval; a pandas DataFrame with
    pandas installed), ``warnings`` and the report as ``str()``."""

    def __init__(self, path: str, summary: Dict[str, Any], text: str, warnings: List[str]) -> None:
        self.path = path
        self.summary = summary
        self._text = text
        #: The fit's own warnings and what the calibration's errors say against it.
        self.warnings = list(summary.get("warnings") or []) + list(warnings)

    @property
    def factors(self) -> Any:
        rows = [
            {
                "parameter": p["parameter"],
                "factor": p["factor"],
                "low": u["factor_interval"][0],
                "high": u["factor_interval"][1],
            }
            for p, u in zip(self.summary["parameters"], self.summary["uncertainty"])
        ]
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows, columns=["parameter", "factor", "low", "high"]).set_index(
            "parameter"
        )

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        errors = self.summary.get("errors", {})
        loo = errors.get("leave_one_out", {})
        return "<archplace.Calibration {} on {} measurements: leave-one-out {:.1f}% mean>".format(
            self.path, errors.get("measurements"), loo.get("mean_percent", float("nan"))
        )


def calibrate(
    measurements: Union[str, "os.PathLike[str]"],
    output: Union[None, str, "os.PathLike[str]"] = None,
    progress: Any = None,
    plugin_dir: Union[None, str, "os.PathLike[str]"] = None,
) -> Calibration:
    """Fits the cost model's calibratable parameters to a measurements file and writes the
    calibration (default: ``NAME.calibration.toml`` beside ``NAME.toml``), as
    ``archplace calibrate`` does (docs/calibration.md). ``progress``: a callable that hears
    each step of the fit as a line, True to print them on stderr."""
    import datetime
    import sys

    source = Path(os.fspath(measurements))
    out = source.with_name(f"{source.stem}.calibration.toml") if output is None else Path(os.fspath(output))
    if progress is True:

        def progress(line: str) -> None:
            print(line, file=sys.stderr)

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    summary, text, warnings = _archplace.calibrate(
        str(source), str(out), _plugin_dirs(plugin_dir), date, progress if callable(progress) else None
    )
    return Calibration(str(out), json.loads(summary), text, warnings)
