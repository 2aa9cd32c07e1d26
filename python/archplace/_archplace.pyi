"""Types of the native module (python/src/lib.rs); use the functions of `archplace`."""

from typing import List, Optional, Tuple

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
