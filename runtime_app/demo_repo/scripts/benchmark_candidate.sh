#!/bin/sh
# Times one run of the certificate and prints the metric as a final JSON line.
set -e
start=$(date +%s%N)
python certificate.py > /dev/null
end=$(date +%s%N)
echo "{\"median_runtime_ms\": $(( (end - start) / 1000000 ))}"
