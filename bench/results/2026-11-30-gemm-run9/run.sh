set -u
tar xzf .device/g9.tgz
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
timeout 400 python3 bench/gemm_bench.py .device/g9 --out $OUT/g9 > $OUT/g9.log 2>&1; echo "bench rc=$?"
sed -n '/^| workload | dtype/,$p' $OUT/g9/gemm_bench.md | cut -c1-220
