#!/bin/bash
# Device round 2 of issue 29 (one call): the GPU tests of the fused attention and the kernel
# room, lesson 15's recorded data (memory_record_gpu.py), then `smallem bench --attention`.
# Run from the repository root on the GPU machine; logs go to $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-.}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
timeout 120 python3 -m pytest -o addopts= -p no:cacheprovider -q tests/test_attention_fused_gpu.py \
    tests/test_kernel_room.py tests/gpu tests/test_memory.py tests/test_attention_fused.py \
    > "$O/memory_pytest.txt" 2>&1
echo "pytest exit $?" >> "$O/memory_pytest.txt"
tail -4 "$O/memory_pytest.txt"
timeout 100 python3 benchmarks/memory_record_gpu.py "$O" > "$O/memory_record.txt" 2>&1
echo "record exit $?"; tail -22 "$O/memory_record.txt"
timeout 200 python3 -m smallem bench --attention --json "$O/memory_bench.json" > "$O/memory_bench.txt" 2>&1
echo "bench exit $?"; tail -45 "$O/memory_bench.txt"
