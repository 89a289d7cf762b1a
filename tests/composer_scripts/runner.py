"""Runs ported scripts one after another in this process, each in a fresh working directory, and prints one JSON
line per script: ``{"name", "ok", "seconds", "error"}``. One process for all of them: each script would otherwise
import JAX, torch and jaxcomposer again, seconds of CPU apiece; scripts seed what they draw from, so their order
does not matter.

Usage: python tests/composer_scripts/runner.py WORKDIR SCRIPT.py [SCRIPT.py ...]
"""
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path


def main(workdir: str, scripts: list[str]) -> int:
    for script in scripts:
        path = Path(script).resolve()
        cwd = Path(workdir) / path.stem
        cwd.mkdir(parents=True)
        os.chdir(cwd)
        t0, error = time.perf_counter(), None
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                error = f"SystemExit({e.code!r})"
        except BaseException:  # noqa: BLE001  (a script's failure is reported, and the next one runs)
            error = traceback.format_exc()[-8000:]
        sys.stdout.flush()
        sys.stderr.flush()
        print("COMPOSER_SCRIPT " + json.dumps({"name": path.name, "ok": error is None,
                                               "seconds": round(time.perf_counter() - t0, 2), "error": error}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
