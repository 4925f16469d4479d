#!/bin/sh
# Times certificate() inside one Python process (start-up excluded) and prints the metric
# as the final JSON line of stdout, which is how Crucible reads a score.
set -e
python - <<'PY'
import json
import time

from certificate import certificate

start = time.perf_counter()
certificate()
elapsed = time.perf_counter() - start
print(json.dumps({"median_runtime_ms": round(elapsed * 1000, 3)}))
PY
