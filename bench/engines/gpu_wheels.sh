#!/usr/bin/env bash
# Fetch, on this machine, what bench/engines/gpu_check.sh needs on the GPU machine and that machine's
# image lacks: the wheels into .whl/ and SmolLM2's tokenizer into .gpu_assets/tokenizer/ (both
# ignored through .git/info/exclude). The GPU machine reaches no registry; the working tree,
# these two folders carried, must stay under 64 MiB together (the total is printed).
#
#   bench/engines/gpu_wheels.sh                       # cp312 wheels for the image's python3 (3.12)
#   PY_VERSION=3.11 WHEEL_DIR=/tmp/whl311 bench/engines/gpu_wheels.sh   # the same set for another Python
#
# Versions come from constraints.txt (what this project is tested with). Each wheel's
# Requires-Dist is checked against the image's package list (KINDS.md): what is neither there
# nor carried is printed; the check imports none of it (ray alone is replaced, see gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
PY_VERSION=${PY_VERSION:-3.12}
WHEEL_DIR=${WHEEL_DIR:-.whl}
ASSETS=${ASSETS:-.gpu_assets}
KINDS_MD=${KINDS_MD:-/work/.library/device/KINDS.md}
LIMIT_MIB=64

# Not on the image (KINDS.md, 2026-11-17) and imported on the check's path, as measured by running
# gpu_check.sh in a virtualenv holding only the image's packages: the tool server's (Starlette,
# uvicorn with httptools, the MCP SDK with pydantic, OpenTelemetry and cryptography, jsonschema,
# RE2), our protocol's orjson, and what veRL's loss modules import. Declared needs that nothing
# imports on that path (pyjwt, httpcore2, truststore, ...) stay behind; the check below lists them.
# typing-extensions is on the image, but pydantic needs >= 4.16 and the image's version is not
# recorded: a newer copy is harmless, an older one breaks pydantic's import.
CARRY=(
  starlette uvicorn httptools sse-starlette python-multipart orjson
  mcp mcp-types httpx2 opentelemetry-api cryptography cffi
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  jsonschema jsonschema-specifications referencing rpds-py google-re2
  verl omegaconf antlr4-python3-runtime tensordict pyvers codetiming
)
# Built here from their source distribution (pure Python, no wheel on PyPI).
SDIST_ONLY=(antlr4-python3-runtime)

pin() {  # NAME -> NAME==VERSION from constraints.txt (names compared as pip does)
  local want line name
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  while IFS= read -r line; do
    name=$(echo "${line%%==*}" | tr 'A-Z_.' 'a-z--')
    if [ "$name" = "$want" ]; then echo "$line"; return; fi
  done < <(grep -E '^[A-Za-z0-9_.-]+==' constraints.txt)
  echo "gpu_wheels.sh: $1 has no pin in constraints.txt; add one there" >&2
  exit 1
}

mkdir -p "$WHEEL_DIR"
rm -f "$WHEEL_DIR"/*.whl  # one version of each: two stop the whole install there
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
binary=()
source=()
for name in "${CARRY[@]}"; do
  if [[ " ${SDIST_ONLY[*]} " == *" $name "* ]]; then source+=("$(pin "$name")"); else binary+=("$(pin "$name")"); fi
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  "${platforms[@]}" -d "$WHEEL_DIR" "${binary[@]}"
if [ ${#source[@]} -gt 0 ]; then
  "$PYTHON" -m pip wheel -q --no-deps -w "$WHEEL_DIR" "${source[@]}"
fi
for whl in "$WHEEL_DIR"/*.whl; do  # a platform wheel for another machine would not install there
  case "$whl" in
    *-none-any.whl | *-abi3-*x86_64*.whl | *-cp${PY_VERSION/./}-*x86_64*.whl) ;;
    *) echo "gpu_wheels.sh: $whl is not for CPython $PY_VERSION on x86-64" >&2; exit 1 ;;
  esac
done

# The tokenizer of the packaged SmolLM2 (the model itself stays behind: the check builds a
# random one of its own shape), from the directory the model loader writes.
"$PYTHON" - "$ASSETS/tokenizer" <<'EOF'
import shutil
import sys
from pathlib import Path

from trainer_client.backends.models import resolve_model_path

source, target = resolve_model_path("smollm2"), Path(sys.argv[1])
target.mkdir(parents=True, exist_ok=True)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
    if (source / name).is_file():
        shutil.copy(source / name, target / name)
EOF

# Ignored by git (so the working tree stays as it is) and carried by name instead.
exclude=.git/info/exclude
mkdir -p "$(dirname "$exclude")"
for entry in /.whl/ /.gpu_assets/; do
  grep -qxF "$entry" "$exclude" 2>/dev/null || echo "$entry" >>"$exclude"
done

# Requires-Dist of every wheel (markers evaluated for this Python on Linux) against the image.
"$PYTHON" - "$WHEEL_DIR" "$KINDS_MD" "$PY_VERSION" <<'EOF'
import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

wheels, kinds, version = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
env = {"python_version": version, "python_full_version": f"{version}.0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "os_name": "posix", "extra": ""}
carried = {canonicalize_name(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
if not kinds.is_file():
    print(f"(no {kinds}: Requires-Dist not checked against the image's packages)")
    sys.exit(0)
match = re.search(r"Packages: (.*?)\.\s*$", kinds.read_text(), re.MULTILINE)
image = {canonicalize_name(n) for n in match.group(1).split(", ")} if match else set()
if not image:
    sys.exit(f"could not read the image's package list from {kinds}")
for name in sorted(carried & image):
    print(f"note: {name} is on the image too; the carried copy takes precedence there")
missing: dict[str, list[str]] = {}
for wheel in sorted(wheels.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name not in image and name not in carried:
            missing.setdefault(name, []).append(wheel.name.split("-")[0])
for name, wanted_by in sorted(missing.items()):
    print(f"declared, not on the image and not carried: {name} (by {', '.join(sorted(set(wanted_by)))})")
EOF

size() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
wheels=$(size "$WHEEL_DIR")
assets=$(size "$ASSETS")
total=$((tree + wheels + assets))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "wheels: $(ls "$WHEEL_DIR"/*.whl | wc -l) in $WHEEL_DIR, $(mib "$wheels"); tokenizer: $(mib "$assets")"
echo "what travels (working tree $(mib "$tree") + carried): $(mib "$total") of $LIMIT_MIB MiB"
if [ "$total" -gt $((60 * 1048576)) ]; then
  echo "gpu_wheels.sh: over 60 MiB: the device tool refuses more than $LIMIT_MIB MiB" >&2
  exit 1
fi
