"""One `gpumem replay --json` run, for the benchmark scripts: its JSON result, or exit with the
command and its error when it fails."""
import json
import subprocess
import sys


def replay(gpumem, path, conf=""):
    command = [gpumem, "replay", path, "--json"] + (["--conf", conf] if conf else [])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)
