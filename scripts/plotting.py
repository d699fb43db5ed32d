"""Shared by scripts/run_report.py and scripts/run_grid.py: matplotlib with the Agg backend."""
import os
import sys


def import_matplotlib(prog, script, marker, what="plots"):
    """pyplot with the Agg backend, or None. When the python3 running `script` lacks matplotlib
    (a pyenv or venv python3 first on PATH), rerun `script` once under Debian's
    /usr/bin/python3, where scripts/setup.sh installs python3-matplotlib; `marker` is the
    environment variable that stops a second rerun."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError as e:
        system = "/usr/bin/python3"
        if (os.environ.get(marker) != "1" and os.path.exists(system)
                and os.path.realpath(sys.executable) != os.path.realpath(system)):
            os.environ[marker] = "1"
            sys.stdout.flush()
            os.execv(system, [system, os.path.abspath(script)] + sys.argv[1:])
        print(f"{prog}: warning: no {what} ({e}; scripts/setup.sh installs python3-matplotlib)", file=sys.stderr)
        return None
