"""The Python package against the CLI it stands beside: the same numbers to the bit, the
same located problems. Run by scripts/test after the wheel is built and installed into a
fresh virtual environment (`bash scripts/build-python --dev`); the CLI is the workspace's
debug build (target/debug/archplace), the plugins the ones scripts/build-plugins made."""

import json
import math
import subprocess
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
