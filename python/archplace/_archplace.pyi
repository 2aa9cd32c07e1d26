"""Types of the native module (python/src/lib.rs); use the functions of `archplace`."""

from typing import Callable, List, Optional, Tuple

__version__: str

class NativeSpecError(Exception):
    """args: (the problems rendered as the CLI prints them, their JSON list)."""

def validate(
    path: Optional[str], text: Optional[str], name: str, plugin_dirs: List[str]
) -> None: ...
def estimate(
    path: Optional[str],
    text: Optional[str],
    name: str,
    calibration: Optional[str],
    plugin_dirs: List[str],
) -> Tuple[str, str, bool]: ...
def toml_text(json: str) -> str: ...
def search(
    path: Optional[str],
    text: Optional[str],
    name: str,
    calibration: Optional[str],
    plugin_dirs: List[str],
    threads: Optional[int],
    out: Optional[str],
    progress: Optional[Callable[[str, int, int, Optional[float], Optional[float]], None]],
) -> Tuple[str, str, str, List[Tuple[str, str]], bool]: ...
def json_text(toml_text: str, name: str) -> str: ...
def calibrate(
    measurements: str,
    output: str,
    plugin_dirs: List[str],
    date: str,
    progress: Optional[Callable[[str], None]],
) -> Tuple[str, str, List[str]]: ...
