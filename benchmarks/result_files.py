"""The result files BENCHMARKS.md is made from: read once each from one folder, named as the document
names them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

#: what gets printed where a result file has not been written yet
MISSING_FILE = "_Not measured yet: `benchmarks/run_all.sh` writes `{path}`._"


class Results:
    """The result files under one folder, read once each; remembers which were cited."""

    def __init__(self, folder: Path, shown_as: str = "benchmarks/results") -> None:
        self.folder, self.shown_as = Path(folder), shown_as
        self._cache: Dict[str, Optional[Dict]] = {}

    def path(self, name: str) -> str:
        """How the document names a result file."""
        return f"{self.shown_as}/{name}"

    def get(self, name: str) -> Optional[Dict]:
        """The parsed result, None when the file does not exist; ValueError when it is not a result."""
        if name not in self._cache:
            file = self.folder / name
            if not file.is_file():
                self._cache[name] = None
            else:
                try:
                    self._cache[name] = json.loads(file.read_text())
                except ValueError as exc:
                    raise ValueError(f"{file} is not JSON ({exc}); re-run the step of benchmarks/run_all.sh "
                                     "that writes it") from None
        return self._cache[name]

    def all_files(self) -> List[str]:
        """Every benchmark result in the folder (JSON with a "benchmark" field), sorted."""
        names = sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*.json"))
        return [n for n in names if isinstance(self.get(n), dict) and "benchmark" in self.get(n)]
