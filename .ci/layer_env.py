"""Make the virtual environment SIDE see the packages of the environment running this script.

``python -m venv --system-site-packages`` links a new environment to the *base* interpreter, so when ``.ci/run``
is started inside a virtual environment, the side environment would miss everything installed there (matplotlib,
torch, this package).  A ``.pth`` file in SIDE instead adds this interpreter's site directories with
``site.addsitedir`` (which also reads their own ``.pth`` files, e.g. editable installs), after SIDE's own
site-packages, so what is installed into SIDE wins.

    python .ci/layer_env.py .ci-verl
"""

from __future__ import annotations

import site
import sys
import sysconfig
from pathlib import Path


def main(side: str) -> int:
    paths = sysconfig.get_paths()
    candidates = [*site.getsitepackages(), paths["purelib"], paths["platlib"]]
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    outer = [p for p in dict.fromkeys(candidates) if Path(p).is_dir()]
    found = sorted({p.resolve() for p in Path(side).glob("lib*/python*/site-packages")})
    if len(found) != 1:
        print(f"layer_env: {side} holds {len(found)} site-packages folders; expected one venv", file=sys.stderr)
        return 2
    lines = [f"import site; site.addsitedir({p!r})" for p in outer]
    (found[0] / "zz_outer_environment.pth").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
