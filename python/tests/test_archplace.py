"""The Python package against the CLI it stands beside: the same numbers to the bit, the
same located problems. Run by scripts/test after the wheel is built and installed into a
fresh virtual environment (`bash scripts/build-python --dev`); the CLI is the workspace's
debug build (target/debug/archplace), the plugins the ones scripts/build-plugins made."""

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import archplace

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "target" / "debug" / "archplace"
PLUGINS = ROOT / "target" / "plugins"
SPECS = ROOT / "config" / "specs"
FIXTURES = ROOT / "tests" / "fixtures"
LLAMA_70B = SPECS / "estimate-llama3-70b-h100.toml"


def cli(*args):
    """The CLI's stdout and exit status (its plugins from target/plugins)."""
    if not CLI.exists():
        pytest.skip(f"{CLI} is not built")
    run = subprocess.run(
        [str(CLI), *map(str, args), "--plugin-dir", str(PLUGINS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return run.stdout, run.returncode


@pytest.mark.parametrize(
    "spec",
    [
        LLAMA_70B,
        SPECS / "estimate-llama3-8b-fsdp-h100.toml",
        SPECS / "estimate-deepseek-v3-h800.toml",
        SPECS / "estimate-a100.toml",
        FIXTURES / "validation" / "bridge2511-gb200-llama3-70b-fsdp.toml",
    ],
    ids=lambda p: p.stem,
)
def test_an_estimate_is_the_clis_to_the_bit(spec):
    out, status = cli("estimate", spec, "--json")
    assert status == 0
    e = archplace.estimate(spec)
    assert e.feasible
    assert e.to_dict() == json.loads(out)
    assert e.step_seconds == json.loads(out)["step_seconds"]
    text, _ = cli("estimate", spec)
    assert str(e) + "\n" == text


def test_a_calibration_is_applied_as_the_cli_applies_it():
    spec = FIXTURES / "validation" / "nemo2407-llama3-70b.toml"
    calibration = ROOT / "calibrations" / "nvidia-2024-2026.toml"
    out, status = cli("estimate", spec, "--json", "--calibration", calibration)
    assert status == 0
    e = archplace.estimate(spec, calibration=calibration)
    assert e.to_dict() == json.loads(out)
    low, high = e.step_seconds_interval
    assert low < e.step_seconds < high
    assert e.calibration is not None


def test_a_spec_as_text_or_a_dict_is_the_same_spec():
    text = LLAMA_70B.read_text()
    from_path = archplace.estimate(LLAMA_70B)
    from_text = archplace.estimate(text)
    assert from_text.step_seconds == from_path.step_seconds
    import tomllib

    from_dict = archplace.estimate(tomllib.loads(text))
    assert from_dict.step_seconds == from_path.step_seconds
    assert from_dict.memory_bytes == from_path.memory_bytes


def test_the_breakdown_adds_up_to_the_step():
    e = archplace.estimate(LLAMA_70B)
    rows = e.breakdown
    try:
        import pandas

        assert isinstance(rows, pandas.DataFrame)
        seconds, shares = rows["seconds"].sum(), rows["share"].sum()
        assert "forward" in rows.index and "backward" in rows.index
    except ImportError:
        seconds = sum(r["seconds"] for r in rows)
        shares = sum(r["share"] for r in rows)
    assert math.isclose(seconds, e.step_seconds, rel_tol=1e-12)
    assert math.isclose(shares, 1.0, rel_tol=1e-12)


def test_every_field_of_the_document_is_an_attribute():
    e = archplace.estimate(LLAMA_70B)
    for key, value in e.to_dict().items():
        assert getattr(e, key) == value
        assert key in dir(e)
    with pytest.raises(AttributeError):
        e.no_such_field


def test_a_plan_that_cannot_run_is_an_answer():
    text = LLAMA_70B.read_text().replace(
        '[accelerator]\npreset = "h100-sxm-80gb"\n',
        '[accelerator]\npreset = "h100-sxm-80gb"\nhbm = "8 GiB"\n',
    )
    assert "8 GiB" in text
    e = archplace.estimate(text)
    assert not e.feasible
    assert "cannot run" in str(e)
    assert "cannot run" in repr(e)


def test_a_spec_with_mistakes_raises_every_one_located():
    spec = FIXTURES / "spec" / "many-mistakes.toml"
    out, status = cli("validate", spec, "--json")
    assert status == 1
    expected = json.loads(out)
    with pytest.raises(archplace.SpecError) as caught:
        archplace.validate(spec)
    problems = caught.value.errors

    # A missing plugin's message lists the folders searched, which differ (the package's
    # own beside the CLI's).
    def place(message):
        return message.split(" in /")[0]

    assert [(p.line, p.column, p.key, place(p.message)) for p in problems] == [
        (d["line"], d["column"], d["field"], place(d["message"])) for d in expected
    ]
    assert len(problems) > 10
    assert all(p.line > 0 and p.message for p in problems)
    # The rendered report names the file and points at the lines.
    assert "many-mistakes.toml" in str(caught.value)
    # `estimate` raises the same.
    with pytest.raises(archplace.SpecError) as again:
        archplace.estimate(spec)
    assert again.value.errors == problems


def test_a_valid_spec_validates_and_text_mistakes_are_located_in_the_text():
    assert archplace.validate(LLAMA_70B) is None
    text = LLAMA_70B.read_text().replace("micro_batch = 1", "micro_batch = 0")
    with pytest.raises(archplace.SpecError) as caught:
        archplace.validate(text)
    [problem] = caught.value.errors
    assert problem.key == "plan.micro_batch"
    assert text.splitlines()[problem.line - 1].startswith("micro_batch = 0")


def test_what_is_not_a_spec_is_refused():
    with pytest.raises(TypeError):
        archplace.estimate(42)
    with pytest.raises(ValueError):
        archplace.estimate({"name": None})
    with pytest.raises(RuntimeError):
        archplace.estimate(str(ROOT / "no-such-spec.toml"))


def test_estimates_run_in_threads_alike():
    results = []

    def one():
        results.append(archplace.estimate(LLAMA_70B).step_seconds)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1


def small_search_spec():
    """custom-tiny over 16 chips: a search of a few seconds."""
    text = (SPECS / "custom-tiny.toml").read_text()
    for old, new in [
        ("tensor_cores = [1, 2, 4, 8]", "tensor_cores = [4, 8]"),
        ("vector_cores = [1, 2, 4]", "vector_cores = [2, 4]"),
        ("width = { min = 16, max = 128 }", "width = { min = 64, max = 128 }"),
        ("depth = { min = 16, max = 128 }", "depth = { min = 64, max = 128 }"),
        ('buffer = ["8 MiB", "32 MiB"]', 'buffer = ["32 MiB"]'),
    ]:
        assert old in text
        text = text.replace(old, new)
    return text


def test_a_search_is_the_clis(tmp_path):
    text = small_search_spec()
    spec = tmp_path / "small.toml"
    spec.write_text(text)
    out, status = cli("run", spec, "--json", "--out", tmp_path / "cli")
    assert status == 0
    expected = json.loads(out)
    events = []
    r = archplace.search(text, progress=lambda *e: events.append(e), out=tmp_path / "py")
    assert not r.interrupted
    assert r.best == expected["best"]
    doc = r.to_dict()
    assert doc["search"]["candidates_evaluated"] == expected["search"]["candidates_evaluated"]
    assert (tmp_path / "py" / "result.json").exists()
    assert (tmp_path / "py" / "explored.jsonl").exists()
    explored = r.explored
    rows = len(explored)
    assert rows == doc["search"]["candidates_evaluated"] > 1
    best = max(
        (row for row in (explored.to_dict("records") if hasattr(explored, "to_dict") else explored)),
        key=lambda row: row["samples_per_second"] or 0.0,
    )
    assert best["samples_per_second"] == r.best["mean_throughput_samples_per_second"]
    # The progress events: (kind, done, total, best samples/s, best area), done growing.
    assert events and all(e[0] in ("progress", "bounding") for e in events)
    done = [e[1] for e in events if e[0] == "progress"]
    assert done == sorted(done) and done[-1] <= rows
    assert r.explain().startswith("search `custom-tiny`")
    assert "best chip:" in str(r)
    assert r.pareto_svg.lstrip().startswith("<svg") and r._repr_svg_() == r.pareto_svg
    assert "<pre>" in r._repr_html_()


def test_a_search_stops_at_the_first_error_of_its_progress_callback():
    class Enough(Exception):
        pass

    def stop(*event):
        raise Enough()

    with pytest.raises(Enough):
        archplace.search(small_search_spec(), progress=stop)


def test_ctrl_c_interrupts_a_search():
    import _thread
    import time

    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        archplace.search((SPECS / "custom-tiny.toml").read_text(), progress=False)
    assert time.monotonic() - started < 30


def test_a_spec_varied_by_dotted_keys_is_that_spec():
    base = archplace.Spec(LLAMA_70B)
    assert base["plan.tensor_parallel"] == 4 and base["models[0].preset"] == "llama3-70b"
    varied = base.with_values({"plan.micro_batch": 2, "training.global_batch": 256})
    assert base["plan.micro_batch"] == 1, "the original is unchanged"
    text = (
        LLAMA_70B.read_text()
        .replace("micro_batch = 1", "micro_batch = 2")
        .replace("global_batch = 128", "global_batch = 256")
    )
    assert "global_batch = 256" in text
    assert archplace.estimate(varied).to_dict() == archplace.estimate(text).to_dict()
    assert archplace.estimate(base).to_dict() == archplace.estimate(LLAMA_70B).to_dict()
    # Its problems are located in its TOML text.
    with pytest.raises(archplace.SpecError) as caught:
        archplace.validate(base.with_values({"plan.micro_batch": 0}))
    [problem] = caught.value.errors
    assert problem.key == "plan.micro_batch"
    assert base.with_values({"plan.micro_batch": 0}).to_toml().splitlines()[problem.line - 1].startswith(
        "micro_batch = 0"
    )


def test_the_sweep_example_runs_200_plans(tmp_path):
    sys.path.insert(0, str(ROOT / "python" / "examples"))
    try:
        import sweep
    finally:
        sys.path.pop(0)
    rows = sweep.sweep()
    assert len(rows) == 200
    fits = [r for r in rows if r["feasible"]]
    assert fits and all(r["step_seconds"] > 0 for r in fits)
    # A row is the example with its values, estimated.
    row = fits[0]
    values = {f"plan.{k}": row[k] for k in ("tensor_parallel", "pipeline_parallel", "data_parallel", "interleaving", "micro_batch", "recomputation", "sequence_parallel")}
    assert archplace.estimate(archplace.Spec(LLAMA_70B).with_values(values)).step_seconds == row["step_seconds"]
    out = tmp_path / "sweep.png"
    subprocess.run([sys.executable, str(ROOT / "python" / "examples" / "sweep.py"), str(out)], check=True, cwd=tmp_path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert out.stat().st_size > 1000


def test_a_calibration_is_the_clis(tmp_path):
    measurements = FIXTURES / "validation" / "measurements-deepspeed-a100.toml"
    out, status = cli("calibrate", measurements, "--json", "-o", tmp_path / "cli.toml")
    assert status == 0
    expected = json.loads(out)
    lines = []
    c = archplace.calibrate(measurements, output=tmp_path / "py.toml", progress=lines.append)
    for key in ("plugin", "parameters", "uncertainty", "errors", "source"):
        assert c.summary[key] == expected[key], key
    text, _ = cli("calibrate", measurements, "-o", tmp_path / "cli2.toml")
    # The report, then what the calibration's errors say against it.
    assert text.startswith(str(c)) and str(c).startswith("calibration of `gpu-like`")
    assert lines, "the fit reports its steps"
    factors = c.factors
    assert len(factors) == len(expected["parameters"])
    # The calibration applies as the CLI's does.
    spec = FIXTURES / "validation" / "deepspeed-mtnlg-530b-2240.toml"
    assert archplace.estimate(spec, calibration=c.path).step_seconds == archplace.estimate(
        spec, calibration=tmp_path / "cli.toml"
    ).step_seconds
