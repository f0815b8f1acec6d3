set -u
tar xzf .device/att.tgz
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$O/r
python3 .device/graph_check.py .device/att/B 2>&1 | tail -2
timeout 150 python3 bench/gemm_bench.py .device/att --out $OUT/att > $OUT/att.log 2>&1; echo "bench rc=$?"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/att/gemm_bench.json"))
for w in d["results"]:
    for r in w["rows"]:
        print(w["run"], r["kernel"][-30:], r["disposition"], round(r["time_us"] or 0, 1))
PY
